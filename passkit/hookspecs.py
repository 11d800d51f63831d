"""Own the extension contract: every pluggy hook that passkit calls, documented.

Plugins are modules (or objects) of ``@passkit.hookimpl`` functions, found through the
``passkit`` entry-point group. The built-in passes and instruments are plugins too and use
exactly these hooks. An implementation may accept any subset of a hook's arguments; hooks only
ever gain arguments, never lose or rename them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from passkit.pass_api import Pass
    from passkit.runner import StepContext

__all__ = ["hookspec", "hookimpl", "PROJECT_NAME"]

PROJECT_NAME = "passkit"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def passkit_register_passes() -> list[Pass]:
    """Return the passes this plugin provides.

    Returns:
        A list of :class:`passkit.Pass` objects, usually built with ``@passkit.graph_pass``.
        A name that another plugin already registered is an error naming both distributions.

    Example::

        @passkit.hookimpl
        def passkit_register_passes():
            return [fold_double_neg]
    """


@hookspec
def passkit_register_decompositions() -> dict[str, Callable[[], dict[Any, Callable[..., Any]]]]:
    """Return named decomposition tables for the ``decompose`` pass's ``tables`` option.

    Returns:
        A mapping from table name to a zero-argument factory that returns
        ``{OpOverload: decomposition}``. Factories run lazily, only when a pipeline uses them.

    Example::

        @passkit.hookimpl
        def passkit_register_decompositions():
            return {"acme_softmax": lambda: {torch.ops.aten._softmax.default: my_softmax}}
    """


@hookspec
def passkit_register_pipelines() -> list[Path]:
    """Return pipeline files this plugin ships; each file's stem is its pipeline name.

    Returns:
        A list of paths to ``.toml`` files. ``passkit pipelines`` lists them, and
        ``extends = "<name>"`` and ``passkit.compile(pipeline="<name>")`` find them.

    Example::

        @passkit.hookimpl
        def passkit_register_pipelines():
            return [Path(__file__).parent / "acme.toml"]
    """


@hookspec(firstresult=True)
def passkit_run_step(context: StepContext) -> bool | None:
    """Run one pipeline step; the first non-None result wins.

    The built-in implementation applies ``context.pass_`` with ``context.options`` to
    ``context.program`` and returns the pass's own claim of change. Cross-cutting concerns
    (timing, graph dumps, verification) are ``@hookimpl(wrapper=True)`` implementations that
    ``yield`` to the step and read or annotate ``context.record`` around it.

    Args:
        context: the step's position, resolved options, the program, the pipeline settings
            and the report row being filled in.

    Example::

        @passkit.hookimpl(wrapper=True)
        def passkit_run_step(context):
            started = time.perf_counter()
            result = yield
            print(context.step.id, time.perf_counter() - started)
            return result
    """
