"""docs/hooks.md documents exactly the hooks in passkit.core.hookspecs, and its examples work.

Each hook's heading is rebuilt from the spec pluggy reads (``## name(arg, ...)``), so adding,
renaming or extending a hook without updating the page fails here, and so does a section for a
hook that does not exist. Each section's example is executed and registered as a plugin.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pluggy
import pytest
import torch

import passkit

from passkit.core import hookspecs
from passkit.frontends.capture import program_from_function
from passkit.pipeline import load_pipeline
from passkit.core.plugins import make_plugin_manager
from passkit.core.registry import build_registry
from passkit.core.runner import run_pipeline

DOC = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
HEADING = re.compile(r"^## (\S+)\((.*)\)$", re.MULTILINE)
EXAMPLE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def spec_callers() -> dict[str, pluggy.HookCaller]:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return {name: caller for name, caller in vars(pm.hook).items() if not name.startswith("_") and caller.has_spec()}


def expected_headings() -> dict[str, str]:
    return {name: f"## {name}({', '.join(caller.spec.argnames)})" for name, caller in spec_callers().items()}


def doc_sections() -> dict[str, str]:
    """Each ``## hook(...)`` heading line mapped to the text up to the next heading."""
    text = DOC.read_text(encoding="utf-8")
    matches = list(HEADING.finditer(text))
    return {
        m.group(0): text[m.end() : matches[i + 1].start() if i + 1 < len(matches) else len(text)]
        for i, m in enumerate(matches)
    }


def section(hook: str) -> str:
    return doc_sections()[expected_headings()[hook]]


def test_every_hook_has_a_heading_with_its_arguments() -> None:
    documented = set(doc_sections())
    missing = [heading for heading in expected_headings().values() if heading not in documented]
    assert missing == []


def test_no_heading_documents_a_hook_that_does_not_exist() -> None:
    extra = sorted(set(doc_sections()) - set(expected_headings().values()))
    assert extra == []


def test_hookspecs_define_the_hooks_this_test_knows() -> None:
    # If this fails, a hook was added: document it, and give it an example test below.
    assert sorted(expected_headings()) == [
        "passkit_loaded_from_cache",
        "passkit_register_decompositions",
        "passkit_register_facts",
        "passkit_register_passes",
        "passkit_register_patterns",
        "passkit_register_pipelines",
        "passkit_register_settings",
        "passkit_run_step",
        "passkit_should_apply",
        "passkit_should_run_step",
    ]


@pytest.mark.parametrize("hook", sorted(spec_callers()))
def test_section_states_the_calling_convention(hook: str) -> None:
    first_result = bool(spec_callers()[hook].spec.opts.get("firstresult"))
    text = section(hook)
    assert "**When it is called:**" in text
    if first_result:
        assert "**Calling convention:** first result (`firstresult=True`)" in text
    else:
        assert "**Calling convention:** collecting" in text


def example_plugin(hook: str, tmp_path: Path) -> types.ModuleType:
    """Execute the section's example (its last python block) as a module in ``tmp_path``."""
    blocks = EXAMPLE.findall(section(hook))
    module = types.ModuleType(f"hooks_doc_{hook}")
    module.__file__ = str(tmp_path / f"{module.__name__}.py")
    exec(compile(blocks[-1], f"{DOC.name}: {hook}", "exec"), module.__dict__)
    assert callable(getattr(module, hook)), f"the {hook} example defines no {hook}"
    return module


def manager_with(plugin: types.ModuleType) -> pluggy.PluginManager:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(plugin, name="doc_example")  # pluggy validates the argument names here
    return pm


def test_register_passes_example(tmp_path: Path) -> None:
    registry = build_registry(manager_with(example_plugin("passkit_register_passes", tmp_path)))
    entry = registry.passes["acme.count_nodes"]
    assert entry.plugin == "doc_example"
    assert entry.pass_.summary == "Record how many FX nodes the program has; change nothing."


def test_register_decompositions_example(tmp_path: Path) -> None:
    registry = build_registry(manager_with(example_plugin("passkit_register_decompositions", tmp_path)))
    table = registry.decompositions["acme_silu"]()
    x = torch.randn(5)
    torch.testing.assert_close(table[torch.ops.aten.silu.default](x), torch.nn.functional.silu(x))


def test_register_pipelines_example(tmp_path: Path) -> None:
    (tmp_path / "pipelines").mkdir()
    shipped = tmp_path / "pipelines" / "acme.toml"
    shipped.write_text('[pipeline]\nextends = "inference"\n')
    registry = build_registry(manager_with(example_plugin("passkit_register_pipelines", tmp_path)))
    assert registry.pipelines["acme"] == shipped
    assert load_pipeline("acme", registry=registry).name == "acme"


def test_register_patterns_example(tmp_path: Path) -> None:
    from passkit.passes.rewrite import resolve_pattern_set
    from passkit.patterns import apply_patterns

    registry = build_registry(manager_with(example_plugin("passkit_register_patterns", tmp_path)))
    assert registry.providers["pattern set:acme:gelu_tanh"] == "plugin 'doc_example' (not from an installed distribution)"
    patterns = resolve_pattern_set("acme:gelu_tanh", registry)
    program = program_from_function(lambda x: torch.nn.functional.gelu(x) * 2, [torch.randn(3, 5)])
    load = build_registry(make_plugin_manager(load_entry_points=False)).get_pass("functionalize")
    load.run(program)
    assert dict(apply_patterns(program.graphs["main"], [patterns]).counts) == {"acme:gelu_tanh:gelu": 1}


def test_run_step_example_adds_a_figure_to_every_step(tmp_path: Path) -> None:
    pm = manager_with(example_plugin("passkit_run_step", tmp_path))
    registry = build_registry(pm)
    program = program_from_function(lambda x: x.sin() + 1, [torch.randn(3)])

    report = run_pipeline(load_pipeline("inference-python", registry=registry), program, pm=pm, registry=registry)

    ran = [record for record in report.records if record.status == "ran"]
    assert ran and all(isinstance(record.stats.get("cpu_ms"), float) for record in ran)
    assert "compiled" in program.facts


def test_register_facts_example_is_verified_after_every_step(tmp_path: Path) -> None:
    plugin = example_plugin("passkit_register_facts", tmp_path)

    @passkit.graph_pass("acme.double_neg", produces={"acme.no_double_neg"})
    def double_neg(program):
        """Claim the fact, then break it."""
        gm = program.graphs["main"]
        output = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(output):
            twice = gm.graph.call_method("neg", (gm.graph.call_method("neg", (output.args[0][0],)),))
        output.args = ((twice, *output.args[0][1:]),)
        gm.recompile()
        return True

    plugin.passkit_register_passes = passkit.hookimpl(lambda: [double_neg])
    pm = manager_with(plugin)
    registry = build_registry(pm)
    assert registry.facts["acme.no_double_neg"].description == "no neg(neg(x)) remains"
    path = tmp_path / "p.toml"
    repro = tmp_path / "repro"
    path.write_text(
        f'[settings]\nverify = "facts"\nrepro_dir = "{repro}"\n'
        '[[steps]]\npass = "acme.double_neg"\n[[steps]]\npass = "codegen.python"\n'
    )
    program = program_from_function(lambda x: x.sin(), [torch.randn(3)])
    with pytest.raises(passkit.VerificationError) as caught:
        run_pipeline(load_pipeline(str(path), registry=registry), program, pm=pm, registry=registry)
    assert str(caught.value) == (
        f"{path}: steps[0] (acme.double_neg) broke fact 'acme.no_double_neg': main:neg_1 negates a negation "
        f"(reproducer: {repro}/01-acme.double_neg)"
    )


def test_a_pass_naming_an_unregistered_fact_is_refused(tmp_path: Path) -> None:
    @passkit.graph_pass("acme.claims", produces={"acme.unknown"})
    def claims(program):
        """Produce a fact nobody defines."""
        return False

    plugin = types.SimpleNamespace(passkit_register_passes=passkit.hookimpl(lambda: [claims]))
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(plugin, name="acme")
    with pytest.raises(passkit.PluginError) as caught:
        build_registry(pm)
    assert str(caught.value) == (
        "plugin 'acme' (not from an installed distribution): pass 'acme.claims' names fact 'acme.unknown', "
        "which no plugin registers; return a passkit.Fact for it from passkit_register_facts"
    )


def test_register_settings_example_is_accepted_and_validated(tmp_path: Path) -> None:
    pm = manager_with(example_plugin("passkit_register_settings", tmp_path))
    registry = build_registry(pm)
    good = tmp_path / "good.toml"
    good.write_text('[pipeline]\nextends = "inference-python"\n[settings]\nacme_trace = true\n')
    pipeline = load_pipeline(str(good), registry=registry)
    assert pipeline.settings.acme_trace is True
    assert pipeline.with_settings(acme_trace=False).settings.acme_trace is False
    assert pipeline.explain()["settings"]["acme_trace"] == {"value": True, "from": str(good)}
    bad = tmp_path / "bad.toml"
    bad.write_text('[pipeline]\nextends = "inference-python"\n[settings]\nacme_trace = "yes"\n')
    with pytest.raises(passkit.PipelineError) as caught:
        load_pipeline(str(bad), registry=registry)
    assert str(caught.value) == f"{bad}: settings.acme_trace: expected a boolean, got a string (\"yes\")"


def test_a_setting_two_plugins_declare_is_refused(tmp_path: Path) -> None:
    import pydantic

    class Clash(pydantic.BaseModel):
        verify: str = "x"

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(types.SimpleNamespace(passkit_register_settings=passkit.hookimpl(lambda: Clash)), name="acme")
    with pytest.raises(passkit.PluginError) as caught:
        build_registry(pm)
    assert str(caught.value) == (
        "duplicate setting 'verify': declared by passkit and plugin 'acme' (not from an installed distribution)"
    )


def test_should_run_step_example_skips_a_step(tmp_path: Path) -> None:
    pm = manager_with(example_plugin("passkit_should_run_step", tmp_path))
    registry = build_registry(pm)
    program = program_from_function(lambda x: x.sin() + x.sin(), [torch.randn(3)])

    report = run_pipeline(load_pipeline("inference-python", registry=registry), program, pm=pm, registry=registry)

    cse = next(record for record in report.records if record.id == "fx.cse")
    assert (cse.status, cse.reason) == ("skipped", "skipped by the acme bisector")
    assert [r.status for r in report.records if r.id != "fx.cse"] == ["ran"] * (len(report.records) - 1)
    assert "compiled" in program.facts


def test_should_apply_example_lets_only_the_first_two_pattern_applications_happen(tmp_path: Path) -> None:
    pm = manager_with(example_plugin("passkit_should_apply", tmp_path))
    registry = build_registry(pm)
    path = tmp_path / "p.toml"
    path.write_text(
        '[[steps]]\npass = "functionalize"\n'
        '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\n'
        '[[steps]]\npass = "codegen.python"\n'
    )
    program = program_from_function(lambda x: (x * 1 + 1) * 1 * 1 + 2, [torch.randn(3)])

    report = run_pipeline(load_pipeline(str(path), registry=registry), program, pm=pm, registry=registry)

    rewrite = next(record for record in report.records if record.id == "rewrite")
    assert rewrite.stats["applied"] == {"noops:mul_one": 2}
    # The third x * 1 is asked about twice (applications 3 and 4): once in the round that
    # rewrote the first two, once more in the round that finds nothing left to do.
    assert rewrite.stats["refused"] == {"noops:mul_one: vetoed": 2}
    assert sum(node.target is torch.ops.aten.mul.Tensor for node in program.graphs["main"].graph.nodes) == 1
    x = torch.randn(3)
    torch.testing.assert_close(program.compiled["main"](x)[0], x + 3)


def test_loaded_from_cache_example_sees_a_hit_and_only_a_hit(tmp_path: Path, register_passkit_plugin) -> None:
    plugin = register_passkit_plugin(example_plugin("passkit_loaded_from_cache", tmp_path), name="doc_example")

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() * 2

    x = torch.randn(3, requires_grad=True)
    passkit.aot_function(f, pipeline="training-python")(x)
    assert plugin.HITS == []
    passkit.aot_function(f, pipeline="training-python")(x)
    steps = len(passkit.load_pipeline("training-python").steps)
    assert plugin.HITS == [("training-python", steps, ["main"])]
