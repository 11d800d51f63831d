"""The plugin manager: built-ins first, entry points, import failures, blocking and tracing."""

from __future__ import annotations

import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import passkit.core.plugins as plugins
from passkit.errors import PluginError
from passkit.core.plugins import BUILTIN_PLUGINS, get_plugin_manager, make_plugin_manager
from passkit.core.registry import build_registry, get_registry

REPO = Path(__file__).resolve().parents[2]

ACME_PASSES = """
import passkit

@passkit.graph_pass("acme.fold")
def fold(program) -> bool:
    "Fold things."
    return False

@passkit.hookimpl
def passkit_register_passes():
    return [fold]
"""


@pytest.fixture
def make_dist(tmp_path, monkeypatch):
    """Install a fake distribution (dist-info with entry_points.txt) plus its modules on sys.path."""
    site = tmp_path / "site"

    def install(name: str, version: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
        dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
        (dist_info / "entry_points.txt").write_text(f"[passkit]\n{lines}")
        for module, source in modules.items():
            (site / f"{module}.py").write_text(textwrap.dedent(source))
            monkeypatch.delitem(sys.modules, module, raising=False)

    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(plugins.DISABLE_ENV, raising=False)
    monkeypatch.delenv(plugins.TRACE_ENV, raising=False)
    yield install
    for module in [name for name in sys.modules if name.startswith("acme_")]:
        del sys.modules[module]


def acme_lines(err: str) -> list[str]:
    """stderr lines about the test's plugins (built-ins still being written may report too)."""
    return [line for line in err.splitlines() if "acme" in line or "ghost" in line]


def test_builtins_are_listed_once_not_as_entry_points():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "passkit" not in pyproject["project"]["entry-points"]
    names = [name for name, _ in make_plugin_manager(load_entry_points=False).list_name_plugin()]
    assert names == [name for name, _ in BUILTIN_PLUGINS]


def test_essential_builtins_cannot_be_blocked(monkeypatch, capsys):
    monkeypatch.setenv("PASSKIT_DISABLE_PLUGINS", "apply_pass,core_facts,dumps")
    pm = make_plugin_manager(load_entry_points=False)
    assert pm.has_plugin("apply_pass") and pm.has_plugin("core_facts") and not pm.has_plugin("dumps")
    assert capsys.readouterr().err.splitlines() == [
        "passkit: plugin 'apply_pass' is essential and cannot be disabled",
        "passkit: plugin 'core_facts' is essential and cannot be disabled",
    ]


def test_builtins_register_before_entry_points(make_dist):
    make_dist("acme-passes", "1.0", {"acme": "acme_passes"}, {"acme_passes": ACME_PASSES})
    pm = make_plugin_manager()
    names = [name for name, _ in pm.list_name_plugin()]
    assert names.index("fx_cleanup") < names.index("codegen_python") < names.index("acme")
    registry = build_registry(pm)
    assert registry.passes["acme.fold"].plugin == "acme"
    assert (registry.passes["acme.fold"].distribution, registry.passes["acme.fold"].distribution_version) == (
        "acme-passes",
        "1.0",
    )
    assert registry.passes["fx.dce"].distribution == "passkit"


def test_plugin_that_fails_to_import_is_one_line_and_the_others_load(make_dist, capsys):
    make_dist(
        "acme-passes",
        "1.0",
        {"acme": "acme_passes", "broken": "acme_broken"},
        {"acme_passes": ACME_PASSES, "acme_broken": "import nope\n"},
    )
    pm = make_plugin_manager()
    assert acme_lines(capsys.readouterr().err) == [
        "passkit: plugin 'broken' (acme-passes 1.0) failed to import: ModuleNotFoundError: No module named 'nope'"
    ]
    registry = build_registry(pm)
    assert "acme.fold" in registry.passes
    assert "fx.dce" in registry.passes
    assert registry.failed_plugins["broken"] == "failed to import: ModuleNotFoundError: No module named 'nope'"


def test_a_missing_builtin_module_is_reported_not_fatal(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "BUILTIN_PLUGINS", (("ghost", "passkit.passes.ghost"), *BUILTIN_PLUGINS))
    pm = make_plugin_manager(load_entry_points=False)
    assert acme_lines(capsys.readouterr().err) == [
        "passkit: plugin 'ghost' (passkit 0.1.0) failed to import: "
        "ModuleNotFoundError: No module named 'passkit.passes.ghost'"
    ]
    assert pm.has_plugin("fx_cleanup")
    assert "ghost" in pm.failed_plugins


def test_passkit_disable_plugins_blocks_by_name_before_import(make_dist, monkeypatch):
    make_dist("acme-passes", "1.0", {"acme": "acme_passes"}, {"acme_passes": ACME_PASSES})
    monkeypatch.setenv("PASSKIT_DISABLE_PLUGINS", "acme, fx_cleanup")
    pm = make_plugin_manager()
    assert pm.is_blocked("acme") and pm.is_blocked("fx_cleanup")
    assert "acme_passes" not in sys.modules
    registry = build_registry(pm)
    assert "acme.fold" not in registry.passes
    assert "fx.dce" not in registry.passes
    assert "codegen.python" in registry.passes


def test_an_entry_point_named_like_a_builtin_is_skipped(make_dist):
    make_dist("acme-passes", "1.0", {"fx_cleanup": "acme_passes"}, {"acme_passes": ACME_PASSES})
    registry = build_registry(make_plugin_manager())
    assert "acme_passes" not in sys.modules
    assert registry.passes["fx.dce"].plugin == "fx_cleanup"


def test_duplicate_pass_name_across_distributions(make_dist):
    source = ACME_PASSES.replace('"acme.fold"', '"fx.dce"')
    make_dist("acme-passes", "1.0", {"acme": "acme_passes"}, {"acme_passes": source})
    with pytest.raises(PluginError) as info:
        build_registry(make_plugin_manager())
    assert str(info.value) == (
        "duplicate pass name 'fx.dce': registered by plugin 'fx_cleanup' (passkit 0.1.0) "
        "and plugin 'acme' (acme-passes 1.0)"
    )


def test_a_misspelt_hook_unregisters_only_that_plugin(make_dist, capsys):
    misspelt = ACME_PASSES.replace("def passkit_register_passes", "def passkit_register_pases")
    make_dist(
        "acme-passes",
        "1.0",
        {"acme": "acme_typo", "good": "acme_passes"},
        {"acme_typo": misspelt, "acme_passes": ACME_PASSES},
    )
    pm = make_plugin_manager()
    assert acme_lines(capsys.readouterr().err) == [
        "passkit: plugin 'acme' (acme-passes 1.0) failed to register: "
        "unknown hook 'passkit_register_pases'; did you mean 'passkit_register_passes'?"
    ]
    assert not pm.has_plugin("acme")
    assert "acme.fold" in build_registry(pm).passes


def test_trace_plugins_prints_hook_calls(monkeypatch, capsys):
    monkeypatch.setenv("PASSKIT_TRACE_PLUGINS", "1")
    pm = make_plugin_manager(builtins=False, load_entry_points=False)
    pm.hook.passkit_register_pipelines()
    assert capsys.readouterr().err.splitlines() == [
        "passkit-trace: passkit_register_pipelines() -> []",
        "passkit-trace: passkit_register_pipelines = []",
    ]


def test_process_wide_manager_and_registry_are_cached_until_reset(monkeypatch):
    monkeypatch.setenv("PASSKIT_DISABLE_PLUGINS", "fx_cleanup")
    plugins.reset()
    try:
        pm = get_plugin_manager()
        assert get_plugin_manager() is pm
        registry = get_registry()
        assert get_registry() is registry
        assert "fx.dce" not in registry.passes
        monkeypatch.delenv("PASSKIT_DISABLE_PLUGINS")
        plugins.reset()
        assert get_plugin_manager() is not pm
        assert "fx.dce" in get_registry().passes
    finally:
        plugins.reset()
