"""The registry: what plugins register, who registered it, and the errors for bad records."""

from __future__ import annotations

from pathlib import Path

import pytest

import passkit.passes.shipped_pipelines as shipped
from passkit.errors import PluginError
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.plugins import PasskitPluginManager, make_plugin_manager
from passkit.core.registry import PassEntry, build_registry


def _noop(program) -> bool:
    return False


DCE = graph_pass("fx.dce")(_noop)
CODEGEN = graph_pass("codegen.python", produces={"compiled"})(_noop)
OTHER_CODEGEN = graph_pass("acme.codegen", produces={"compiled"})(_noop)


class Registers:
    """A plugin whose register hooks return whatever the test gives it."""

    def __init__(self, passes=None, tables=None, pipelines=None):
        self.passes, self.tables, self.pipelines = passes, tables, pipelines

    @hookimpl
    def passkit_register_passes(self):
        return self.passes

    @hookimpl
    def passkit_register_decompositions(self):
        return self.tables

    @hookimpl
    def passkit_register_pipelines(self):
        return self.pipelines


@pytest.fixture
def pm() -> PasskitPluginManager:
    manager = make_plugin_manager(builtins=False, load_entry_points=False)
    manager.register_plugin(Registers(passes=[DCE, CODEGEN]), "fx_cleanup", distribution=("passkit", "0.1.0"))
    return manager


def test_passes_remember_plugin_and_distribution(pm):
    pm.register_plugin(Registers(passes=[OTHER_CODEGEN]), "acme", distribution=("acme-passes", "1.0"))
    registry = build_registry(pm)
    assert registry.passes["fx.dce"] == PassEntry(DCE, "fx_cleanup", "passkit", "0.1.0")
    assert registry.passes["acme.codegen"] == PassEntry(OTHER_CODEGEN, "acme", "acme-passes", "1.0")
    assert registry.get_pass("codegen.python") is CODEGEN
    assert registry.producers("compiled") == ["codegen.python", "acme.codegen"]
    assert registry.producers("joint") == []
    with pytest.raises(KeyError):
        registry.get_pass("fx.dcee")


def test_duplicate_pass_name_names_both_plugins_and_distributions(pm):
    pm.register_plugin(Registers(passes=[graph_pass("fx.dce")(_noop)]), "acme", distribution=("acme-passes", "1.0"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "duplicate pass name 'fx.dce': registered by plugin 'fx_cleanup' (passkit 0.1.0) "
        "and plugin 'acme' (acme-passes 1.0)"
    )


def test_duplicate_from_a_plugin_without_distribution(pm):
    pm.register(Registers(passes=[DCE]), name="local")
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "duplicate pass name 'fx.dce': registered by plugin 'fx_cleanup' (passkit 0.1.0) "
        "and plugin 'local' (not from an installed distribution)"
    )


def test_a_record_that_is_not_a_pass_is_rejected(pm):
    pm.register_plugin(Registers(passes=[_noop]), "acme", distribution=("acme-passes", "1.0"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    message = str(info.value)
    assert message.startswith("plugin 'acme' (acme-passes 1.0): passkit_register_passes returned <function _noop at ")
    assert message.endswith("> (function), not a passkit.Pass; build passes with @passkit.graph_pass")


def test_a_hook_that_returns_one_pass_instead_of_a_list(pm):
    pm.register_plugin(Registers(passes=DCE), "acme", distribution=("acme-passes", "1.0"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "plugin 'acme' (acme-passes 1.0): passkit_register_passes returned <Pass fx.dce> (Pass), not a list of passes"
    )


def test_decomposition_tables(pm):
    def factory():
        return {}

    pm.register_plugin(Registers(tables={"acme_softmax": factory}), "acme", distribution=("acme-passes", "1.0"))
    registry = build_registry(pm)
    assert registry.decompositions == {"acme_softmax": factory}
    assert registry.providers["decomposition:acme_softmax"] == "plugin 'acme' (acme-passes 1.0)"


def test_duplicate_decomposition_table(pm):
    pm.register_plugin(Registers(tables={"core_aten": dict}), "a", distribution=("a-dist", "1"))
    pm.register_plugin(Registers(tables={"core_aten": dict}), "b", distribution=("b-dist", "2"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "duplicate decomposition table 'core_aten': registered by plugin 'a' (a-dist 1) and plugin 'b' (b-dist 2)"
    )


def test_decomposition_factory_must_be_callable(pm):
    pm.register_plugin(Registers(tables={"core_aten": {}}), "a", distribution=("a-dist", "1"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "plugin 'a' (a-dist 1): passkit_register_decompositions must map table names to zero-argument "
        "factories; got 'core_aten' (str) -> {} (dict)"
    )


def test_pipelines_by_file_stem(pm, tmp_path):
    pm.register_plugin(Registers(pipelines=[tmp_path / "fast.toml"]), "acme", distribution=("acme-passes", "1.0"))
    assert build_registry(pm).pipelines == {"fast": tmp_path / "fast.toml"}


def test_pipeline_records_must_be_toml_paths(pm):
    pm.register_plugin(Registers(pipelines=["fast.yaml"]), "acme", distribution=("acme-passes", "1.0"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "plugin 'acme' (acme-passes 1.0): passkit_register_pipelines returned 'fast.yaml' (str), "
        "not a path to a .toml file"
    )


def test_duplicate_pipeline_name(pm):
    pm.register_plugin(Registers(pipelines=["a/fast.toml"]), "a", distribution=("a-dist", "1"))
    pm.register_plugin(Registers(pipelines=["b/fast.toml"]), "b", distribution=("b-dist", "2"))
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "duplicate pipeline name 'fast': shipped by plugin 'a' (a-dist 1) (a/fast.toml) "
        "and plugin 'b' (b-dist 2) (b/fast.toml)"
    )


def test_shipped_pipelines_are_registered_from_the_package_folder(monkeypatch, tmp_path):
    (tmp_path / "training.toml").write_text("")
    (tmp_path / "notes.md").write_text("")
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    pm = make_plugin_manager(builtins=False, load_entry_points=False)
    pm.register_plugin(shipped, "shipped_pipelines", distribution=("passkit", "0.1.0"))
    registry = build_registry(pm)
    assert registry.pipelines == {"training": tmp_path / "training.toml"}
    assert registry.providers["pipeline:training"] == "plugin 'shipped_pipelines' (passkit 0.1.0)"


def test_shipped_folder_is_the_package_pipelines_symlink():
    assert shipped.SHIPPED_DIR == (Path(shipped.__file__).resolve().parent.parent / "pipelines")
    assert shipped.SHIPPED_DIR.is_dir()


def test_a_register_hook_that_raises_is_reported_and_skipped(pm, capsys):
    class Raises:
        @hookimpl
        def passkit_register_passes(self):
            raise RuntimeError("no GPU here\nsecond line")

    pm.register_plugin(Raises(), "acme", distribution=("acme-passes", "1.0"))
    registry = build_registry(pm)
    assert "fx.dce" in registry.passes
    reason = "failed in passkit_register_passes: RuntimeError: no GPU here"
    assert registry.failed_plugins == {"acme": reason}
    assert capsys.readouterr().err == f"passkit: plugin 'acme' (acme-passes 1.0) {reason}\n"


def test_duplicate_pattern_set_names_name_both_plugins() -> None:
    class First:
        @staticmethod
        @hookimpl
        def passkit_register_patterns():
            return {"acme:fold": []}

    class Second:
        @staticmethod
        @hookimpl
        def passkit_register_patterns():
            return {"acme:fold": []}

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(First(), name="first")
    pm.register(Second(), name="second")
    with pytest.raises(PluginError) as info:
        build_registry(pm)
    assert str(info.value) == (
        "duplicate pattern set name 'acme:fold': registered by plugin 'first' (not from an installed distribution) "
        "and plugin 'second' (not from an installed distribution)"
    )


def test_builtin_pattern_sets_are_registered_by_the_rewrite_plugin() -> None:
    registry = build_registry(make_plugin_manager(load_entry_points=False))
    assert {"attention", "noops"} <= set(registry.patterns)
    assert registry.providers["pattern set:attention"].startswith("plugin 'rewrite'")
