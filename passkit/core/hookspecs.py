"""Own the extension contract: every pluggy hook that passkit calls, and what they receive.

Plugins are modules (or objects) of ``@passkit.hookimpl`` functions, found through the
``passkit`` entry-point group. The built-in passes, facts and instruments are plugins too and
use exactly these hooks. An implementation may accept any subset of a hook's arguments; hooks
only ever gain arguments, never lose or rename them. ``StepContext`` is what the per-step hooks
receive; it gains fields, never loses them.

Wrappers of ``passkit_run_step`` run in a fixed order. The built-in instruments are plain
wrappers registered in this order, innermost first: ``timing`` (times the pass alone),
``dumps``, ``verify`` (so a dump of a failing step exists before verification raises),
``repro`` (so verification failures get a reproducer too), ``progress`` (the running step's
``started`` and heartbeat lines time the whole step). A plugin's plain wrapper,
registered later, wraps all of them; ``tryfirst=True`` makes it the
outermost of all, ``trylast=True`` the innermost (inside ``timing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pluggy

from passkit.core.facts import Fact, after

if TYPE_CHECKING:
    from pathlib import Path

    import pydantic

    from passkit.core.pass_api import Pass
    from passkit.pipeline import Pipeline, Step
    from passkit.core.program import Program
    from passkit.core.report import StepRecord

__all__ = ["hookspec", "hookimpl", "PROJECT_NAME", "Application", "StepContext"]

PROJECT_NAME = "passkit"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True)
class Application:
    """One rewrite a pass is about to make inside a step (a pattern application), as
    ``passkit_should_apply`` sees it. Plain, hashable data, so a plugin may keep it.

    ``index`` counts the step's applications from 1, in the order the pass asks about them;
    ``kind`` says what is applied (``"pattern"``), ``name`` which one (``"attention:sdpa"``),
    ``group`` what it belongs to (the pattern set), ``graph`` the graph it rewrites,
    ``nodes`` the names of the nodes it matched, roots first, and ``source`` the user's line
    that made the first of them (``file.py:123``, or "" when unknown).
    """

    index: int
    kind: str
    name: str
    group: str
    graph: str
    nodes: tuple[str, ...]
    source: str = ""

    def describe(self) -> str:
        """``planted:scale_add (application 3), graph forward, nodes add_1 (model.py:12)``."""
        where = f" ({self.source})" if self.source else ""
        return f"{self.name} (application {self.index}), graph {self.graph}, nodes {', '.join(self.nodes) or '-'}{where}"


@dataclass
class StepContext:
    """Everything a per-step hook may read, or annotate through ``record``, for one step.

    The step's pass is ``step.pass_``, its validated options ``step.options`` and its position
    in the plan ``step.position``; the run's settings are ``pipeline.settings``.
    ``graph_hash_before`` is the program's graph hash before the step, so wrappers can tell
    whether the step changed the graphs without hashing twice. ``reference`` is what
    ``verify = "numerics"`` compares against (None otherwise). ``known_facts`` are the
    registered facts, by name. ``hook`` is the plugin manager's hook relay, through which a
    pass asks ``should_apply`` before each rewrite it makes; ``applications`` counts the asks.
    ``progress`` is the run's progress callback (None: log), to which instruments send
    ``passkit.core.progress.ProgressEvent`` events through ``passkit.core.progress.send``.
    """

    step: Step
    program: Program
    pipeline: Pipeline
    record: StepRecord
    previous: list[str]
    reference: Any | None = None
    known_facts: Mapping[str, Fact] = field(default_factory=dict)
    graph_hash_before: str = ""
    hook: Any = None
    applications: int = 0
    progress: Any = None

    def should_apply(
        self, *, kind: str, name: str, group: str, graph: str, nodes: tuple[str, ...], source: str = ""
    ) -> bool:
        """Ask ``passkit_should_apply`` whether the pass may make its next rewrite (it counts
        as application ``applications + 1``); True unless a plugin says False."""
        self.applications += 1
        if self.hook is None:
            return True
        application = Application(self.applications, kind, name, group, graph, tuple(nodes), source)
        return self.hook.passkit_should_apply(context=self, application=application) is not False

    @property
    def pass_(self) -> Pass:
        """The step's resolved pass (the same object as ``step.pass_``)."""
        return self.step.pass_

    @property
    def graphs_changed(self) -> bool:
        """Whether the graphs differ from what they were before the step (by hash)."""
        return self.program.graph_hash() != self.graph_hash_before

    def facts_after(self) -> set[str]:
        """The facts that hold once this step is done (``passkit.core.facts.after``)."""
        return after(self.program.facts, self.pass_, graphs_changed=self.graphs_changed, table=self.known_facts)

    @property
    def label(self) -> str:
        """``<file>: steps[i] (<id>)``: how every error about this step begins."""
        return self.pipeline.where(self.step)


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
def passkit_register_facts() -> list[Fact]:
    """Return the facts this plugin defines, each with a checker.

    Returns:
        A list of :class:`passkit.Fact`. Every fact a pass ``requires``, ``produces`` or
        ``invalidates`` must be registered by some plugin; ``verify = "facts"`` runs each
        fact's checker after every step, so a pass that breaks a plugin's fact is named too.

    Example::

        @passkit.hookimpl
        def passkit_register_facts():
            return [passkit.Fact("acme.no_double_neg", "no neg(neg(x)) remains", check=find_double_neg)]
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


@hookspec
def passkit_register_patterns() -> dict[str, Any]:
    """Return named pattern sets for the ``rewrite`` pass's ``patterns`` option.

    Returns:
        A mapping from set name to a :class:`passkit.patterns.PatternSet`, a list of
        :class:`passkit.patterns.Pattern`, or a zero-argument factory returning either (so
        tracing happens only when a pipeline uses the set). Third-party names should start
        with the plugin's own prefix (``"acme:gelu_tanh"``). A name that another plugin
        already registered is an error naming both plugins.

    Example::

        @passkit.hookimpl
        def passkit_register_patterns():
            return {"acme:gelu_tanh": lambda: PatternSet("acme:gelu_tanh", (gelu_to_tanh,))}
    """


@hookspec
def passkit_register_settings() -> type[pydantic.BaseModel]:
    """Return a pydantic model whose fields become keys of a pipeline's ``[settings]`` table.

    Returns:
        A model class; each field needs a default. Its keys are validated when a pipeline
        loads, like passkit's own settings, and are read as ``pipeline.settings.<key>``
        (for example from ``context.pipeline.settings`` in a wrapper). A key that passkit or
        another plugin already declares is an error naming both plugins.

    Example::

        class AcmeSettings(pydantic.BaseModel):
            acme_trace: bool = False

        @passkit.hookimpl
        def passkit_register_settings():
            return AcmeSettings
    """


@hookspec(firstresult=True)
def passkit_should_run_step(context: StepContext) -> bool | None:
    """Decide whether a step that applies runs at all; the first non-None result wins.

    Return ``False`` to skip the step (the report row says ``skipped`` with
    ``context.record.reason``, which the implementation may set), ``True`` or ``None`` to let
    it run. This is how bisection and "stop after step N" work without touching the loop.
    A skipped step produces no facts, so later steps that need them fail their requirement.

    Example::

        @passkit.hookimpl
        def passkit_should_run_step(context):
            if context.step.position > LIMIT:
                context.record.reason = f"bisect: past step {LIMIT}"
                return False
            return None
    """


@hookspec(firstresult=True)
def passkit_should_apply(context: StepContext, application: Application) -> bool | None:
    """Decide whether a pass makes one rewrite inside a running step; the first non-None wins.

    Passes that make many independent rewrites (``rewrite``, one pattern application at a
    time) ask before each through ``context.should_apply``. Return ``False`` to veto this one
    (the step's report counts it as refused, ``vetoed``), ``True`` or ``None`` to let it
    happen. This is how bisection finds the first bad pattern application without touching
    the pattern driver. The compile cache keys on the registered plugins' names, so a
    plugin that vetoes never reads or writes another plugin set's entries.

    Example::

        @passkit.hookimpl
        def passkit_should_apply(context, application):
            return False if application.index > LIMIT else None
    """


@hookspec(firstresult=True)
def passkit_run_step(context: StepContext) -> bool | None:
    """Run one pipeline step; the first non-None result wins.

    The built-in implementation applies ``context.step.pass_`` with ``context.step.options``
    to ``context.program`` and returns the pass's own claim of change. Cross-cutting concerns
    (timing, graph dumps, verification) are ``@hookimpl(wrapper=True)`` implementations that
    ``yield`` to the step and read or annotate ``context.record`` around it (see the module
    docstring for their order).

    Args:
        context: the step (its pass, options and position), the program, the pipeline and
            its settings, and the report row being filled in.

    Example::

        @passkit.hookimpl(wrapper=True)
        def passkit_run_step(context):
            started = time.perf_counter()
            result = yield
            print(context.step.id, time.perf_counter() - started)
            return result
    """


@hookspec
def passkit_loaded_from_cache(pipeline: Pipeline, program: Program, report: Any, captured: Mapping[str, Any]) -> None:
    """A compile was answered by the compile cache: no step ran, so no ``passkit_run_step``
    wrapper saw one. Instruments that record a run (the HTML report, the structured trace)
    record it here from the stored ``report`` (its ``records`` are the compiling run's rows,
    ``report.cache == "hit"``).

    Args:
        pipeline: the pipeline whose steps the entry was compiled with.
        program: the loaded program: its final graphs, signature, facts and compiled callables.
        report: the stored ``Report`` of the run that compiled it.
        captured: the graphs as captured, before any step (name -> ``GraphModule``).
    """
