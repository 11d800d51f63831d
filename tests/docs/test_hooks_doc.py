"""docs/hooks.md documents exactly the hooks in passkit.hookspecs, and its examples work.

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

from passkit import hookspecs
from passkit.capture import program_from_function
from passkit.pipeline import load_pipeline
from passkit.plugins import make_plugin_manager
from passkit.registry import build_registry
from passkit.runner import run_pipeline

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
        "passkit_register_decompositions",
        "passkit_register_passes",
        "passkit_register_pipelines",
        "passkit_run_step",
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


def test_run_step_example_adds_a_figure_to_every_step(tmp_path: Path) -> None:
    pm = manager_with(example_plugin("passkit_run_step", tmp_path))
    registry = build_registry(pm)
    program = program_from_function(lambda x: x.sin() + 1, [torch.randn(3)])

    report = run_pipeline(load_pipeline("inference", registry=registry), program, pm=pm, registry=registry)

    ran = [record for record in report.records if record.status == "ran"]
    assert ran and all(isinstance(record.stats.get("cpu_ms"), float) for record in ran)
    assert "compiled" in program.facts
