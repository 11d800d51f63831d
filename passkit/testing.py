"""Own the pytest plugin for pass authors (entry point ``pytest11``).

Fixtures:
- ``passkit_plugin_manager``: a fresh plugin manager (built-ins and installed plugins), so a test
  can register its own plugin without touching the process-wide one;
- ``make_program``: build a captured ``Program`` from a function and example inputs;
- ``register_passkit_plugin``: register a plugin on the process-wide manager for one test, so
  ``passkit.compile`` and pipeline files see its passes; it is unregistered afterwards.

Assertions: ``assert_pass_preserves_numerics(pass_, program, **options)`` runs a pass on a
program and fails, naming the largest difference and the tolerance, if the program now computes
something else. ``assert_pattern_matches(patterns, fn, *inputs, times=None)`` traces ``fn``,
applies a pattern, a ``PatternSet`` or a registered set name, and fails if it matched nothing
(saying why, per candidate node), matched another number of ``times``, or changed numerics. Both
hold results to the rule ``passkit run`` uses (``passkit.verify.compare``): the default ``rtol``/``atol``
loosened to what the pass (for its options) or the pattern sets declare.

``fuzz_pass(pass_or_id, programs=200)`` runs random programs through the pass alone, in the
smallest pipeline that loads with it (``passkit.debug.alone``), compares each with eager
(``passkit.fuzz``), and fails with every difference reduced to a minimal program, its first bad
step and its reproducer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest

__all__ = [
    "assert_pass_preserves_numerics", "assert_pattern_matches", "fuzz_pass", "make_program", "passkit_plugin_manager",
    "register_passkit_plugin",
]


@pytest.fixture
def passkit_plugin_manager() -> Any:
    """A fresh ``pluggy.PluginManager`` with passkit's hookspecs, built-ins and entry points."""
    from passkit.core.plugins import make_plugin_manager

    return make_plugin_manager()


@pytest.fixture
def register_passkit_plugin() -> Any:
    """``register_passkit_plugin(plugin, name=None)``: register for this test only."""
    from passkit.core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    registered: list[Any] = []

    def register(plugin: Any, name: str | None = None) -> Any:
        pm.register(plugin, name=name)
        registered.append(plugin)
        return plugin

    yield register
    for plugin in registered:
        pm.unregister(plugin)


@pytest.fixture
def make_program() -> Callable[..., Any]:
    """``make_program(fn, *inputs, passes=("functionalize",))`` → a ``Program`` ready for a pass.

    The program is captured with ``make_fx`` and then run through the named built-in passes,
    so a pass that requires ``functional`` (or ``joint``) gets a program that has it.
    """
    from passkit.frontends.capture import program_from_function
    from passkit.verify.evaluate import Reference
    from passkit.core.registry import get_registry

    def build(fn: Callable[..., Any], *inputs: Any, passes: Sequence[str] = ("functionalize",)) -> Any:
        program = program_from_function(fn, list(inputs))
        program.notes["real_inputs"] = list(inputs)
        program.notes["reference"] = Reference(program, list(inputs))
        registry = get_registry()
        for name in passes:
            _apply(registry.get_pass(name), program, registry, {})
        # Figures the preparation passes recorded are not the pass under test's.
        program.stats.clear()
        return program

    return build


def assert_pass_preserves_numerics(pass_: Any, program: Any, **options: Any) -> bool:
    """Run ``pass_`` (a Pass or a registered name) on ``program``; fail if numerics change.

    Fails first if the program lacks a fact the pass requires, as the runner would. Afterwards
    ``program.stats`` holds what this pass recorded. Returns whether the graphs changed,
    judged by their code hash.
    """
    from passkit.verify.evaluate import Reference
    from passkit.core.registry import get_registry

    registry = get_registry()
    if isinstance(pass_, str):
        pass_ = registry.get_pass(pass_)
    reference = program.notes.get("reference")
    if reference is None:
        real = program.notes.get("real_inputs")
        if real is None:
            raise ValueError("build the program with the make_program fixture, which keeps its inputs")
        reference = Reference(program, real)
    missing = sorted(pass_.requires - program.facts)
    if missing:
        facts = ", ".join(sorted(program.facts)) or "none"
        pytest.fail(
            f"pass {pass_.name} requires fact {missing[0]!r}, which the program lacks (facts: {facts}); "
            "build it with make_program(..., passes=[...]) naming a pass that produces it",
            pytrace=False,
        )
    before = program.graph_hash()
    # As the runner does per step: afterwards ``program.stats`` holds only this pass's figures.
    program.stats.clear()
    validated = _apply(pass_, program, registry, options)
    deviation = reference.compare(program, _tolerance([pass_.declared_tolerance(validated)]))
    if deviation is not None:
        pytest.fail(f"pass {pass_.name} changed numerics: {deviation}", pytrace=False)
    return program.graph_hash() != before


def _apply(pass_: Any, program: Any, registry: Any, options: dict[str, Any]) -> Any:
    """Run one pass as the runner would: options validated against the registry, facts updated
    by ``passkit.core.facts.after``; returns the validated options."""
    from passkit.core.facts import after

    before = program.graph_hash()
    validated = pass_.options(registry=registry, **options)
    pass_.run(program, validated)
    program.facts = after(program.facts, pass_, graphs_changed=program.graph_hash() != before, table=registry.facts)
    return validated


def _tolerance(declared: Sequence[Any]) -> Any:
    """``passkit.verify.compare.tolerance_for``'s rule without a pipeline: the default ``rtol``/``atol``
    loosened to the loosest of the ``declared`` ``(rtol, atol)`` pairs (None: none declared)."""
    from passkit.verify.compare import DEFAULT_TOLERANCE, Tolerance, loosest

    return Tolerance(*loosest([DEFAULT_TOLERANCE, *declared]))


def assert_pattern_matches(
    patterns: Any,
    fn: Callable[..., Any],
    *inputs: Any,
    times: int | None = None,
    passes: Sequence[str] = ("functionalize",),
    numerics: bool = True,
) -> Any:
    """Trace ``fn`` on ``inputs`` (through ``passes``), rewrite with ``patterns``; fail unless it
    applied (exactly ``times`` times, if given) and, with ``numerics``, the result still
    matches eager.

    ``patterns``: a ``Pattern``, a ``PatternSet``, a list of them, or a registered set name.
    Returns the driver's ``Applied`` (counts per pattern name); with ``numerics=False`` (for a
    rewrite that changes results on purpose) ``(applied, program)``, to check results yourself.
    """
    from passkit.frontends.capture import program_from_function
    from passkit.verify.evaluate import Reference
    from passkit.passes.rewrite import resolve_pattern_set
    from passkit.patterns import Pattern, PatternSet, apply_patterns
    from passkit.patterns.debug import why_not
    from passkit.core.registry import get_registry

    registry = get_registry()
    if isinstance(patterns, str):
        patterns = resolve_pattern_set(patterns, registry)
    items = list(patterns) if isinstance(patterns, (list, tuple)) else [patterns]
    program = program_from_function(fn, list(inputs))
    reference = Reference(program, list(inputs))
    for name in passes:
        _apply(registry.get_pass(name), program, registry, {})
    canonical = program.target_opset
    flat = [p for item in items for p in (item.patterns if isinstance(item, PatternSet) else [item])]
    applied = None
    for name, gm in program.graphs.items():
        result = apply_patterns(gm, flat, canonical=canonical)
        applied = result if applied is None else (applied.merge(result) or applied)
    total = applied.total if applied is not None else 0
    if total == 0 or (times is not None and total != times):
        # Nothing applied means the graphs are as traced: say why, per candidate node.
        reasons = [line for p in flat if isinstance(p, Pattern) for gm in program.graphs.values() for line in why_not(gm, p, canonical=canonical, limit=2)]
        wanted = "at least once" if times is None else f"{times} times"
        pytest.fail(
            f"patterns applied {total} times, expected {wanted}; applied: {dict(applied.counts) if applied else {}}"
            + ("; " + "; ".join(reasons[:6]) if total == 0 else ""),
            pytrace=False,
        )
    if not numerics:
        return applied, program
    deviation = reference.compare(program, _tolerance([getattr(item, "tolerance", None) for item in items]))
    if deviation is not None:
        pytest.fail(f"patterns changed numerics: {deviation}", pytrace=False)
    return applied



def fuzz_pass(
    pass_or_id: Any, programs: int = 200, *, pipeline: Any = "training-python", seed: int = 0, out: Any = None,
    seconds: float | None = None,
) -> Any:
    """Fuzz one pass (a ``Pass``, a registered name, or a step id of ``pipeline``) alone, in the
    smallest pipeline made from ``pipeline`` that loads with it: ``programs`` random programs
    (or as many as ``seconds`` allow), each compared with eager. Fails naming every difference:
    its minimal program as source, its first bad step and the reproducer folder (under ``out``,
    else a fresh temporary folder). Returns the ``passkit.fuzz.session.Summary``."""
    import tempfile
    from pathlib import Path

    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry
    from passkit.debug.alone import pipeline_alone
    from passkit.frontends.api import load_pipeline
    from passkit.fuzz.session import fuzz

    registry, pm = get_registry(), get_plugin_manager()
    alone = pipeline_alone(load_pipeline(pipeline), pass_or_id, registry)
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="passkit-fuzz-"))
    summary = fuzz(alone, seed=seed, programs_count=programs, seconds=seconds, out=folder, pm=pm, registry=registry)
    if summary.differences:
        lines = [f"fuzzing {alone.name} ({', '.join(step.id for step in alone.steps)}): {summary.line()}"]
        lines += [line for case in summary.cases for line in case.lines(with_source=True)]
        pytest.fail("\n".join(lines), pytrace=False)
    return summary

