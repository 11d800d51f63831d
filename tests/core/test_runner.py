"""The step loop: which steps run, how change is judged, facts bookkeeping and error text."""

from __future__ import annotations

import pytest

from passkit.core import runner
from passkit.errors import PassError, PipelineError
from passkit.core.hookspecs import StepContext, hookimpl
from passkit.core.pass_api import graph_pass
from passkit.pipeline import Pipeline, Settings, Step
from passkit.core.program import Program

from tiny_programs import Kit, make_program



@graph_pass("t.liar")
def liar(program: Program) -> bool:
    """Claim a change without making one."""
    return True


@graph_pass("t.drop_dead", produces={"functional"})
def drop_dead(program: Program) -> bool:
    """Remove unread nodes, and say nothing about it."""
    gm = program.graphs["main"]
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return False


@graph_pass("t.joint", requires={"functional"}, produces={"joint"}, training_only=True)
def fake_joint(program: Program) -> bool:
    """Pretend to build the joint graph."""
    return False


@graph_pass("t.split", requires={"joint"}, produces={"partitioned"}, invalidates={"joint"})
def fake_split(program: Program) -> bool:
    """Pretend to partition."""
    return False


@graph_pass("t.compile", produces={"compiled"})
def fake_compile(program: Program) -> bool:
    """Give every graph a callable."""
    program.compiled = {name: gm.forward for name, gm in program.graphs.items()}
    return False


@graph_pass("t.stats")
def stats(program: Program, *, saved: int = 3) -> bool:
    """Record figures."""
    program.record_stat("saved", saved)
    program.record_stat("saved_bytes", saved * 4096)
    return False


@graph_pass("t.fail")
def fail(program: Program) -> bool:
    """Fail with a two-line message."""
    raise ValueError("shapes disagree\nlong explanation")


@graph_pass("t.fail_quietly")
def fail_quietly(program: Program) -> bool:
    """Fail with a passkit error of its own."""
    raise PipelineError("")


class RunnerTestPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [liar, drop_dead, fake_joint, fake_split, fake_compile, stats, fail, fail_quietly]


@pytest.fixture
def harness() -> Kit:
    return Kit(RunnerTestPasses())


def test_change_is_judged_by_hashes_not_by_the_pass(harness: Kit) -> None:
    report = harness.run(harness.pipeline("t.liar", "t.drop_dead"), make_program(dead=True))
    liar_record, drop_record = report.records
    assert (liar_record.changed, liar_record.claimed_changed) == (False, True)
    assert (drop_record.changed, drop_record.claimed_changed) == (True, False)
    assert (drop_record.nodes_before, drop_record.nodes_after) == (6, 5)
    assert report.table().splitlines()[3].split()[3] == "no"


def test_skipped_steps_are_recorded_with_their_reason(harness: Kit) -> None:
    pipeline = harness.pipeline(
        {"pass": "t.liar", "id": "off", "enabled": False},
        {"pass": "t.liar", "id": "train-only", "when": "training"},
        "t.drop_dead",
        "t.joint",
        {"pass": "t.liar", "id": "infer-only", "when": "inference"},
    )
    seen = []
    report = harness.run(pipeline, make_program(), progress=seen.append)
    assert [(r.id, r.status, r.reason) for r in report.records] == [
        ("off", "skipped", "disabled"),
        ("train-only", "skipped", "when = training"),
        ("t.drop_dead", "ran", ""),
        ("t.joint", "skipped", "inference program"),
        ("infer-only", "ran", ""),
    ]
    assert seen == report.records


def test_training_programs_run_training_steps(harness: Kit) -> None:
    pipeline = harness.pipeline("t.drop_dead", "t.joint", {"pass": "t.liar", "when": "inference"})
    report = harness.run(pipeline, make_program(training=True))
    assert [r.status for r in report.records] == ["ran", "ran", "skipped"]
    assert report.records[2].reason == "when = inference"


def test_facts_follow_each_contract(harness: Kit) -> None:
    program = make_program(training=True)
    harness.run(harness.pipeline("t.drop_dead", "t.joint", "t.split"), program)
    assert program.facts == {"captured", "functional", "partitioned"}


def test_a_missing_fact_stops_the_run_before_the_step(harness: Kit) -> None:
    program = make_program(training=True)
    with pytest.raises(PipelineError) as caught:
        harness.run(harness.pipeline("t.drop_dead", "t.split"), program)
    assert str(caught.value) == (
        "t.toml: steps[1] (t.split): requires fact 'joint', which the program lacks (facts: captured, functional)"
    )


def test_messages_use_the_location_where_the_step_was_written(harness: Kit) -> None:
    pipeline = harness.pipeline({"pass": "t.split", "location": "base.toml: steps[4] (t.split)"})
    with pytest.raises(PipelineError) as caught:
        harness.run(pipeline, make_program())
    assert str(caught.value) == (
        "base.toml: steps[4] (t.split): requires fact 'joint', which the program lacks (facts: captured)"
    )


def test_changing_graphs_after_codegen_drops_stale_callables(harness: Kit) -> None:
    program = make_program(dead=True)
    harness.run(harness.pipeline("t.compile", "t.liar"), program)
    assert "compiled" in program.facts and set(program.compiled) == {"main"}
    harness.run(harness.pipeline("t.drop_dead"), program)
    assert "compiled" not in program.facts
    assert program.compiled == {}


def test_stats_are_per_step(harness: Kit) -> None:
    program = make_program()
    report = harness.run(harness.pipeline({"pass": "t.stats", "options": {"saved": 2}}, "t.liar"), program)
    assert report.records[0].stats == {"saved": 2, "saved_bytes": 8192}
    assert report.records[1].stats == {}
    assert report.records[0].remarks() == "saved=2 (8.0 KiB)"


def test_a_failing_pass_becomes_one_line_naming_the_steps_before(harness: Kit) -> None:
    pipeline = harness.pipeline(
        "t.liar", {"pass": "t.liar", "id": "skipped", "enabled": False}, "t.drop_dead", "t.fail"
    )
    with pytest.raises(PassError) as caught:
        harness.run(pipeline, make_program())
    assert str(caught.value) == (
        "t.toml: steps[3] (t.fail) failed: ValueError: shapes disagree (after: t.liar, t.drop_dead)"
    )
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_failing_first_step_says_so(harness: Kit) -> None:
    with pytest.raises(PassError) as caught:
        harness.run(harness.pipeline("t.fail_quietly"), make_program())
    assert str(caught.value) == "t.toml: steps[0] (t.fail_quietly) failed: PipelineError (first step)"


def test_steps_run_the_pass_they_were_loaded_with(harness: Kit) -> None:
    pipeline = harness.pipeline("t.liar")
    other = Kit()  # its registry does not know t.liar: the step carries its own pass
    report = other.run(pipeline, make_program())
    assert (report.records[0].pass_name, report.records[0].claimed_changed) == ("t.liar", True)


def test_plugins_see_the_step_context(harness: Kit) -> None:
    seen = []

    class Spy:
        @hookimpl(wrapper=True)
        def passkit_run_step(self, context: StepContext):
            seen.append((context.step.position, context.step.id, list(context.previous), dict(context.step.options)))
            return (yield)

    harness.pm.register(Spy())
    pipeline = harness.pipeline("t.liar", {"pass": "t.stats", "id": "figures", "options": {"saved": 5}})
    harness.run(pipeline, make_program())
    assert seen == [(0, "t.liar", [], {}), (1, "figures", ["t.liar"], {"saved": 5})]


def test_a_plugin_can_take_over_running_a_step(harness: Kit) -> None:
    class Refuse:
        @hookimpl(tryfirst=True)
        def passkit_run_step(self, context: StepContext) -> bool:
            return False  # first non-None result wins: the pass itself never runs

    harness.pm.register(Refuse())
    report = harness.run(harness.pipeline("t.fail"), make_program())
    assert report.records[0].claimed_changed is False


def test_a_pipeline_built_in_python_runs_with_the_manager_and_registry_given() -> None:
    from passkit.core.plugins import make_plugin_manager
    from passkit.core.registry import build_registry

    pm = make_plugin_manager(load_entry_points=False)
    registry = build_registry(pm)
    dce = registry.get_pass("fx.dce")
    pipeline = Pipeline(name="inline", description="", source=None, settings=Settings(), settings_origin={},
                        steps=(Step(0, "fx.dce", dce, dce.options(), None, True, {}),))
    report = runner.run_pipeline(pipeline, make_program(dead=True), pm=pm, registry=registry)
    assert (report.records[0].changed, report.records[0].nodes_after) == (True, 5)


@graph_pass("t.asks")
def asks(program: Program, *, times: int = 3, context: StepContext | None = None) -> bool:
    """Ask before each of ``times`` rewrites; record which were allowed."""
    allowed = [
        context.should_apply(kind="pattern", name=f"t:r{i}", group="t", graph="main", nodes=(f"n{i}",))
        for i in range(times)
    ] if context is not None else None
    program.record_stat("allowed", allowed)
    return False


def test_a_pass_taking_context_asks_should_apply_and_context_is_no_option() -> None:
    seen = []

    class VetoSecond:
        @hookimpl
        def passkit_register_passes(self) -> list:
            return [asks]

        @hookimpl
        def passkit_should_apply(self, context: StepContext, application) -> bool | None:
            seen.append((context.step.id, application))
            return False if application.index == 2 else None

    kit = Kit(VetoSecond())
    assert [field["name"] for field in asks.option_fields()] == ["times"]
    report = kit.run(kit.pipeline("t.asks", {"pass": "t.asks", "id": "again", "options": {"times": 1}}), make_program())
    assert [r.stats["allowed"] for r in report.records] == [[True, False, True], [True]]  # counted per step
    assert [(step, a.index, a.name, a.nodes) for step, a in seen] == [
        ("t.asks", 1, "t:r0", ("n0",)), ("t.asks", 2, "t:r1", ("n1",)), ("t.asks", 3, "t:r2", ("n2",)),
        ("again", 1, "t:r0", ("n0",)),
    ]
    assert asks(make_program()) is False  # called directly: no context, nothing asked
