"""The functional ATen graph of a function, as the ``rewrite`` pass sees it (pattern tests)."""

from __future__ import annotations

from typing import Any, Callable

from torch.fx import GraphModule

from passkit.frontends.capture import program_from_function
from passkit.passes.functionalize import functionalize


def functional_main(fn: Callable[..., Any], *inputs: Any) -> GraphModule:
    """``fn`` captured with ``inputs`` and functionalized: its ``main`` graph."""
    program = program_from_function(fn, list(inputs))
    functionalize(program)
    return program.graphs["main"]
