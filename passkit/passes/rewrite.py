"""Own ``rewrite``: apply named pattern sets to every graph of the program.

``patterns`` names sets registered through ``passkit_register_patterns`` (built in: see
``passkit.patterns.sets``). All named sets are applied together by one fixpoint driver, so
patterns from different sets compete for a node by benefit, never by step order. The step's
report row says where it ran (``stage``: ``pre-grad`` on ``main`` before ``joint``, ``joint``,
``post-grad`` on ``forward``/``backward``, or ``inference``), how many times each pattern
applied (``applied``), why matches were refused (``refused``), and which ops it asked later
lowering to keep whole (``kept_ops``, how many: a pattern's ``keep``, added to the ``decompose`` step's
target opset, so that ``joint`` does not lower a fused replacement back to its parts). ``expect_match = true``
fails the step, in one line, when a named set matched nowhere, naming per pattern the nearest
candidate node, its source line and the first thing that failed there; a list names the sets or
patterns (``"attention:causal_masked_fill"``) that must apply. A match vetoed through
``passkit_should_apply`` counts as a match, so bisection can veto them all. ``only`` narrows the named sets to
some of their patterns (``"attention:sdpa"``), as ``passkit bisect`` writes it in a minimal pipeline.
``set_options.<set>`` tunes a set that declares options (``PatternSet.options``), such as the
``attention`` set's ``cpu_min_score_bytes``; it is checked against the set when the file loads.

The step declares the loosest ``tolerance`` of the sets it applies (``PatternSet.tolerance``,
as configured by ``set_options``), so numerics checks of a pipeline that ran it accept an
approximation a set declares (``passkit.verify.compare.tolerance_for``).

Before each application the pass asks ``context.should_apply`` (the ``passkit_should_apply``
hook), so a plugin can veto single applications (bisection finds the first bad one that way).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING, Any

import pydantic

from passkit import _torch
from passkit.core.failed_node import source_line
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.patterns.sets import BUILTIN_SETS
from passkit.core.program import Program

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["rewrite", "RewriteOptions", "resolve_pattern_set", "sets_tolerance", "stage_of"]


class PatternSetName(str):
    """A pattern set's name, carrying what the registry resolved it to."""

    registered: Any


class RewriteOptions(pydantic.BaseModel):
    """``patterns`` are checked against the registry in the validation context (the one the
    pipeline loads with), so a misspelt set fails when the file loads; without one, only the
    built-in sets are known."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    patterns: list[str] = pydantic.Field(min_length=1)
    expect_match: bool | list[str] = False
    graphs: list[str] | None = None
    max_applications: int = pydantic.Field(default=1000, ge=1)
    only: list[str] | None = None
    set_options: dict[str, dict[str, Any]] = pydantic.Field(default_factory=dict)

    @pydantic.field_validator("patterns", mode="after")
    @classmethod
    def _known_sets(cls, names: list[str], info: pydantic.ValidationInfo) -> list[str]:
        registry = (info.context or {}).get("registry")
        registered = registry.patterns if registry is not None else BUILTIN_SETS
        resolved = []
        for name in names:
            if name not in registered:
                raise ValueError(_unknown(name, registered))
            set_name = PatternSetName(name)
            set_name.registered = registered[name]
            # A set whose factory refuses its own patterns (two of one name) is bad input: say so
            # when the file loads, not when the step runs.
            resolve_pattern_set(set_name)
            resolved.append(set_name)
        return resolved

    @pydantic.model_validator(mode="after")
    def _set_options_fit(self) -> RewriteOptions:
        named = {str(name): name for name in self.patterns}  # each carries its registered set
        for name, values in self.set_options.items():
            if name not in named:
                raise ValueError(f"set_options names {name!r}, which patterns does not list ({', '.join(named)})")
            try:
                resolve_pattern_set(named[name]).configured(values)
            except pydantic.ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"set_options.{name}.{where}: {first['msg']}") from None
        return self


def _unknown(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known)) or 'none'})"
    return f"unknown pattern set {name!r}{hint}"


def stage_of(program: Program) -> str:
    """Where in the flow the program's graphs are, for the report."""
    if "joint" in program.graphs:
        return "joint"
    if "forward" in program.graphs or "backward" in program.graphs:
        return "post-grad"
    return "pre-grad" if program.training else "inference"


def resolve_pattern_set(name: str, registry: Any = None) -> Any:
    """The ``PatternSet`` registered as ``name`` (in ``registry``, or among the built-ins; a
    name from validated options carries its own); ValueError with a did-you-mean otherwise."""
    from passkit.patterns import Pattern, PatternSet

    if isinstance(name, PatternSetName):
        value = name.registered
    else:
        known = registry.patterns if registry is not None else BUILTIN_SETS
        if name not in known:
            raise ValueError(_unknown(name, known))
        value = known[name]
    if callable(value) and not isinstance(value, (PatternSet, Pattern)):
        value = value()
    description = ""
    if isinstance(value, PatternSet):
        patterns, description = value.patterns, value.description
    elif isinstance(value, (list, tuple)) and all(isinstance(p, Pattern) for p in value):
        patterns = tuple(value)
    else:
        raise ValueError(f"pattern set {name!r} is {type(value).__name__}, not a PatternSet or a list of patterns")
    # Names in counts and errors say which set a pattern came from.
    qualified = tuple(dataclasses.replace(p, name=f"{name}:{p.name}") for p in patterns)
    return PatternSet(
        name, qualified, description, requires=getattr(value, "requires", ()),
        options=getattr(value, "options", None), configure=getattr(value, "configure", None),
        tolerance=getattr(value, "tolerance", None),
    )


def sets_tolerance(options: RewriteOptions) -> tuple[float, float] | None:
    """The loosest of the pattern sets the step applies.

    None when no set declares one: they keep eager's numerics."""
    from passkit.verify.compare import loosest

    sets = [resolve_pattern_set(name).configured(options.set_options.get(name)) for name in options.patterns]
    return loosest(s.tolerance for s in sets)


@graph_pass("rewrite", requires={"functional"}, options=RewriteOptions, tolerance=sets_tolerance)
def rewrite(
    program: Program,
    *,
    patterns: list[str],
    expect_match: bool | list[str],
    graphs: list[str] | None,
    max_applications: int,
    only: list[str] | None,
    set_options: dict[str, dict[str, Any]],
    context: StepContext | None = None,
) -> bool:
    """Apply named pattern sets (attention, noops, plugins' sets) to a fixpoint, by benefit."""
    from passkit.patterns import Applied
    from passkit.patterns.driver import expect_match as require

    # Names carry their registered sets; options were validated when the pipeline loaded.
    sets = [resolve_pattern_set(name).configured(set_options.get(name)) for name in patterns]
    if only is not None:
        sets = _only(sets, only)
    canonical = program.target_opset
    applied = Applied()
    graph_names = graphs if graphs is not None else list(program.graphs)
    for graph_name in graph_names:
        if graph_name not in program.graphs:
            raise ValueError(f"no graph {graph_name!r} (graphs: {', '.join(program.graphs)})")
        ask = _asker(context, graph_name)
        applied.merge(_apply_checked(program, graph_name, sets, _canonical_for(program, graph_name, canonical), max_applications, ask))
    program.record_stat("stage", stage_of(program))
    program.record_stat("rewrites", applied.total)
    program.record_stat("applied", dict(sorted(applied.counts.items())))
    if applied.refused:
        program.record_stat("refused", dict(sorted(applied.refused.items())))
    _keep_replacement_ops(program, sets, applied)
    if expect_match:
        explain = _explainer(program, graph_names, sets, canonical)
        require(applied, patterns if expect_match is True else expect_match, explain=explain)
    return applied.total > 0


def _explainer(program: Program, graph_names: list[str], sets: list[Any], canonical: Any) -> Any:
    """``expect_match``'s reasons: per pattern under a name, its nearest miss in the graphs the
    step rewrote (as they are now, after the patterns that did apply)."""
    from passkit.patterns.debug import nearest_misses

    def explain(name: str) -> str:
        patterns = [p for s in sets for p in s.patterns if p.name == name or p.name.startswith(f"{name}:")]
        graphs = [(g, program.graphs[g], _canonical_for(program, g, canonical)) for g in graph_names]
        return nearest_misses(patterns, graphs)

    return explain


def _only(sets: list[Any], only: list[str]) -> list[Any]:
    """The sets cut down to the patterns ``only`` names; ValueError naming one it does not find."""
    known = {p.name for s in sets for p in s.patterns}
    for name in only:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (patterns: {', '.join(sorted(known))})"
            raise ValueError(f"only names pattern {name!r}, which the named sets do not have{hint}")
    return [dataclasses.replace(s, patterns=tuple(p for p in s.patterns if p.name in only)) for s in sets]


def _asker(context: StepContext | None, graph_name: str) -> Any:
    """The driver's veto for ``graph_name``: each match becomes one ``passkit_should_apply`` ask."""
    if context is None:
        return None

    def ask(match: Any) -> bool:
        name = match.pattern.name
        group = name.rsplit(":", 1)[0] if ":" in name else ""
        nodes = tuple(dict.fromkeys(n.name for n in (*match.roots, *match.nodes)))
        source = source_line(match.roots[0]) or ""
        return context.should_apply(kind="pattern", name=name, group=group, graph=graph_name, nodes=nodes, source=source)

    return ask


def _canonical_for(program: Program, graph_name: str, canonical: Any) -> Any:
    """The form patterns are traced to: a training program's ``main`` keeps the ops that
    ``decompose`` leaves for ``joint`` (those with their own autograd formula)."""
    if canonical is None or graph_name != "main" or not program.training:
        return canonical
    from passkit.passes.decompose import main_table

    return dataclasses.replace(canonical, table=main_table(canonical.table, training=True))


def _apply_checked(program: Program, name: str, sets: list[Any], canonical: Any, max_applications: int, ask: Any = None) -> Any:
    """Apply the sets to one graph. When a replacement changed strides (``gemm``'s split
    parts), re-derive every node's ``meta["val"]`` on fake tensors; if a later op cannot take
    the new layout, put the graph back as it was and report the rewrites as refused."""
    from passkit.patterns import Applied, apply_patterns

    gm = program.graphs[name]
    targets = {node.target for node in gm.graph.nodes if node.op == "call_function"}
    sets = [s for s in sets if s.may_match(targets)]  # spares tracing sets that cannot match
    if not sets:
        return Applied()
    backup = _copy_graph(gm.graph)
    applied = apply_patterns(gm, sets, canonical=canonical, max_applications=max_applications, should_apply=ask)
    if not applied.relayout:
        return applied
    error = _torch.propagate_fake_values(gm)
    if error is None:
        return applied
    gm.graph = backup
    gm.recompile()
    undone = Applied()
    for pattern_name, count in applied.counts.items():
        undone.refused[f"{pattern_name}: later ops need the old layout ({error})"] += count
    return undone


def _copy_graph(graph: Any) -> Any:
    import torch.fx

    copy = torch.fx.Graph()
    copy.output(copy.graph_copy(graph, {}))
    copy._codegen = graph._codegen
    return copy


def _keep_replacement_ops(program: Program, sets: list[Any], applied: Any) -> None:
    """Tell later lowering (``joint`` re-traces through the decompose table) to keep what the
    applied replacements introduced, or it would lower them straight back."""
    target = program.target_opset
    if target is None or not applied.total:
        return
    wanted = [op for s in sets for p in s.patterns if applied.counts.get(p.name) for op in p.keep]
    extra = tuple(op for op in dict.fromkeys(wanted) if op not in target.keep)
    if not extra:
        return
    ops = {overload for name in extra for overload in _overloads(name)}
    program.target_opset = dataclasses.replace(
        target,
        keep=target.keep + extra,
        table={op: fn for op, fn in target.table.items() if op not in ops},
        kept=frozenset(target.kept) | ops,
    )
    program.record_stat("kept_ops", len(extra))


def _overloads(name: str) -> list[Any]:
    from passkit.passes.decompose import resolve_op

    op = resolve_op(name)
    return [getattr(op, n) for n in op.overloads()] if isinstance(op, _torch.OpOverloadPacket) else [op]


@hookimpl
def passkit_register_passes() -> list:
    return [rewrite]


@hookimpl
def passkit_register_patterns() -> dict[str, Any]:
    return dict(BUILTIN_SETS)
