"""The Dynamo settings passkit's own ``passkit.compile`` runs Dynamo under, per torch release.

torch 2.15's Dynamo cannot trace a ``nested_compile_region`` (``invoke_subgraph``) whose body
reads a Python float under ``dynamic=True`` (each LayerNorm's ``eps``): it passes the float as a
tensor that the body ``.item()``s, and the body's subgraph then refers to a value it never takes
(``Freevar has no source: node.op=call_method node.name=item``), with every backend, ``eager``
included. passkit specializes such floats anyway, after capture (``specialize_float_inputs``:
each one a constant under a guard on its value), so on 2.15 its compiles ask Dynamo to specialize
them from the start (``specialize_float``), which guards on the same values. torch 2.11 to 2.14
trace those bodies, and keep Dynamo's defaults.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from passkit._torch.versions import TORCH_2_15

__all__ = ["under_passkits_dynamo_settings"]


def _settings() -> dict[str, Any]:
    return {"specialize_float": True} if TORCH_2_15 else {}


def under_passkits_dynamo_settings(compiled: Any) -> Any:
    """``torch.compile``'s result, calling Dynamo under passkit's settings for this torch.

    A compiled module keeps its type (its ``forward`` is wrapped); a compiled function is
    wrapped. With no settings to apply, ``compiled`` itself.
    """
    settings = _settings()
    if not settings:
        return compiled
    patch = torch._dynamo.config.patch(**settings)
    if isinstance(compiled, torch.nn.Module):
        compiled.forward = patch(compiled.forward)
        return compiled
    return functools.wraps(compiled)(patch(compiled))
