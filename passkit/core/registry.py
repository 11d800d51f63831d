"""Own the name lookups: passes, facts, decomposition tables, pipeline files, settings keys and
pattern sets.

The registry is collected from every plugin's ``passkit_register_*`` hooks and remembers which
plugin (and distribution) gave what, so that a duplicate name is an error naming both sides.
Every fact a pass names must be registered, so ``verify = "facts"`` can check it. The settings
model is passkit's ``Settings`` extended with every plugin's ``passkit_register_settings``.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


import pydantic

from passkit.errors import PluginError
from passkit.core.facts import Fact
from passkit.core.pass_api import Pass
from passkit.pipeline.model import Settings
from passkit.core.plugins import PasskitPluginManager, describe_plugin, get_plugin_manager

__all__ = ["PassEntry", "Registry", "build_registry", "get_registry"]


@dataclass(frozen=True)
class PassEntry:
    """A registered pass and the plugin (and distribution) that registered it."""

    pass_: Pass
    plugin: str
    distribution: str  # "passkit" for built-ins; "" when the plugin is not from a distribution
    distribution_version: str = ""


@dataclass
class Registry:
    """Everything the plugins registered, by name."""

    passes: dict[str, PassEntry] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)
    settings_model: type[Settings] = Settings
    decompositions: dict[str, Callable[[], dict]] = field(default_factory=dict)
    pipelines: dict[str, Path] = field(default_factory=dict)
    # Pattern set name -> a PatternSet, a list of patterns, or a factory of either.
    patterns: dict[str, Any] = field(default_factory=dict)
    failed_plugins: dict[str, str] = field(default_factory=dict)
    # Which plugin gave each fact, table, pipeline file and setting ("plugin 'x' (dist 1.0)").
    providers: dict[str, str] = field(default_factory=dict)

    def get_pass(self, name: str) -> Pass:
        """The pass registered as ``name``; KeyError if none is."""
        return self.passes[name].pass_

    def with_passes(self, passes: dict[str, Pass]) -> Registry:
        """A copy that also resolves ``passes`` (a dict pipeline's ``Pass`` objects, which no
        plugin registered) by name; this registry is left as it is."""
        added = {name: PassEntry(pass_, "<python>", "") for name, pass_ in passes.items()}
        return dataclasses.replace(self, passes={**self.passes, **added})

    def producers(self, fact: str) -> list[str]:
        """Names of the passes that produce ``fact``, in registration order."""
        return [name for name, entry in self.passes.items() if fact in entry.pass_.produces]


_cached: tuple[PasskitPluginManager, frozenset[int], Registry] | None = None


def get_registry() -> Registry:
    """The registry of the process-wide plugin manager.

    Rebuilt when the manager is replaced or a plugin is registered on it or unregistered, so
    ``get_plugin_manager().register(my_plugin)`` is all a Python user needs.
    """
    global _cached
    pm = get_plugin_manager()
    plugins = frozenset(id(p) for p in pm.get_plugins())
    if _cached is None or _cached[0] is not pm or _cached[1] != plugins:
        _cached = (pm, plugins, build_registry(pm))
    return _cached[2]


def build_registry(pm: PasskitPluginManager) -> Registry:
    """Collect passes, decomposition tables and pipeline files from every plugin of ``pm``.

    Raises:
        PluginError: a duplicate name, or a record that is not what the hook promises.
    """
    registry = Registry(failed_plugins=dict(pm.failed_plugins))
    for plugin_name, facts in _results(pm, registry, "passkit_register_facts"):
        for fact in _as_list(pm, plugin_name, "passkit_register_facts", facts, "facts"):
            _add_fact(pm, registry, plugin_name, fact)
    for plugin_name, records in _results(pm, registry, "passkit_register_passes"):
        for record in _as_list(pm, plugin_name, "passkit_register_passes", records, "passes"):
            _add_pass(pm, registry, plugin_name, record)
    for plugin_name, tables in _results(pm, registry, "passkit_register_decompositions"):
        for table_name, factory in _as_mapping(pm, plugin_name, tables).items():
            _add_table(pm, registry, plugin_name, table_name, factory)
    for plugin_name, paths in _results(pm, registry, "passkit_register_pipelines"):
        for path in _as_list(pm, plugin_name, "passkit_register_pipelines", paths, "paths"):
            _add_pipeline(pm, registry, plugin_name, path)
    for plugin_name, sets in _results(pm, registry, "passkit_register_patterns"):
        mapping = _as_mapping(pm, plugin_name, sets, "passkit_register_patterns", "set name -> pattern set")
        for set_name, value in mapping.items():
            _add_pattern_set(pm, registry, plugin_name, set_name, value)
    settings_fields: dict[str, Any] = {}
    for plugin_name, model in _results(pm, registry, "passkit_register_settings"):
        _add_settings(pm, registry, plugin_name, model, settings_fields)
    if settings_fields:
        registry.settings_model = pydantic.create_model("Settings", __base__=Settings, **settings_fields)
    return registry


def _add_fact(pm: PasskitPluginManager, registry: Registry, plugin_name: str, fact: Any) -> None:
    who = describe_plugin(pm, plugin_name)
    if not isinstance(fact, Fact):
        raise PluginError(f"{who}: passkit_register_facts returned {_describe_value(fact)}, not a passkit.Fact")
    key = f"fact:{fact.name}"
    if fact.name in registry.facts:
        raise PluginError(f"duplicate fact {fact.name!r}: registered by {registry.providers[key]} and {who}")
    registry.facts[fact.name] = fact
    registry.providers[key] = who


def _check_pass_facts(pm: PasskitPluginManager, registry: Registry, plugin_name: str, pass_: Pass) -> None:
    for fact in sorted(pass_.requires | pass_.produces | pass_.invalidates):
        if fact not in registry.facts:
            raise PluginError(
                f"{describe_plugin(pm, plugin_name)}: pass {pass_.name!r} names fact {fact!r}, which no plugin "
                "registers; return a passkit.Fact for it from passkit_register_facts"
            )


def _add_settings(
    pm: PasskitPluginManager, registry: Registry, plugin_name: str, model: Any, fields: dict[str, Any]
) -> None:
    who = describe_plugin(pm, plugin_name)
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        raise PluginError(f"{who}: passkit_register_settings returned {_describe_value(model)}, not a pydantic model class")
    for key, info in model.model_fields.items():
        if info.is_required():
            raise PluginError(f"{who}: setting {key!r} needs a default")
        owner = registry.providers.get(f"setting:{key}", "passkit" if key in Settings.model_fields else None)
        if owner is not None:
            raise PluginError(f"duplicate setting {key!r}: declared by {owner} and {who}")
        fields[key] = (info.annotation, info)
        registry.providers[f"setting:{key}"] = who

def _results(pm: PasskitPluginManager, registry: Registry, hook_name: str) -> list[tuple[str, Any]]:
    """Call each plugin's implementation of a register hook, oldest registration first."""
    results = []
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        if impl.hookwrapper or impl.wrapper:
            continue
        try:
            value = impl.function()
        except Exception as exc:  # a broken plugin must not take the others down
            text = str(exc).strip().splitlines()
            reason = f"failed in {hook_name}: {type(exc).__name__}" + (f": {text[0]}" if text else "")
            registry.failed_plugins[impl.plugin_name] = reason
            print(f"passkit: {describe_plugin(pm, impl.plugin_name)} {reason}", file=sys.stderr)
            continue
        if value is not None:
            results.append((impl.plugin_name, value))
    return results


def _describe_value(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _as_list(pm: PasskitPluginManager, plugin_name: str, hook_name: str, value: Any, what: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    raise PluginError(
        f"{describe_plugin(pm, plugin_name)}: {hook_name} returned {_describe_value(value)}, not a list of {what}"
    )


def _as_mapping(
    pm: PasskitPluginManager,
    plugin_name: str,
    value: Any,
    hook_name: str = "passkit_register_decompositions",
    what: str = "table name -> factory",
) -> dict:
    if isinstance(value, dict):
        return value
    raise PluginError(
        f"{describe_plugin(pm, plugin_name)}: {hook_name} returned {_describe_value(value)}, not a dict of {what}"
    )


def _add_pattern_set(pm: PasskitPluginManager, registry: Registry, plugin_name: str, name: Any, value: Any) -> None:
    who = describe_plugin(pm, plugin_name)
    if not isinstance(name, str) or not name:
        raise PluginError(f"{who}: pattern set names must be non-empty strings; got {_describe_value(name)}")
    key = f"pattern set:{name}"
    if name in registry.patterns:
        raise PluginError(f"duplicate pattern set name {name!r}: registered by {registry.providers[key]} and {who}")
    registry.patterns[name] = value
    registry.providers[key] = who


def _distribution(pm: PasskitPluginManager, plugin_name: str) -> tuple[str, str]:
    return pm.distributions.get(plugin_name, ("", ""))


def _add_pass(pm: PasskitPluginManager, registry: Registry, plugin_name: str, record: Any) -> None:
    if not isinstance(record, Pass):
        raise PluginError(
            f"{describe_plugin(pm, plugin_name)}: passkit_register_passes returned "
            f"{_describe_value(record)}, not a passkit.Pass; build passes with @passkit.graph_pass"
        )
    existing = registry.passes.get(record.name)
    if existing is not None:
        raise PluginError(
            f"duplicate pass name {record.name!r}: registered by "
            f"{describe_plugin(pm, existing.plugin)} and {describe_plugin(pm, plugin_name)}"
        )
    _check_pass_facts(pm, registry, plugin_name, record)
    dist_name, version = _distribution(pm, plugin_name)
    registry.passes[record.name] = PassEntry(record, plugin_name, dist_name, version)


def _add_table(pm: PasskitPluginManager, registry: Registry, plugin_name: str, table_name: Any, factory: Any) -> None:
    who = describe_plugin(pm, plugin_name)
    if not isinstance(table_name, str) or not callable(factory):
        raise PluginError(
            f"{who}: passkit_register_decompositions must map table names to zero-argument "
            f"factories; got {_describe_value(table_name)} -> {_describe_value(factory)}"
        )
    key = f"decomposition:{table_name}"
    if table_name in registry.decompositions:
        raise PluginError(
            f"duplicate decomposition table {table_name!r}: registered by {registry.providers[key]} and {who}"
        )
    registry.decompositions[table_name] = factory
    registry.providers[key] = who


def _add_pipeline(pm: PasskitPluginManager, registry: Registry, plugin_name: str, path: Any) -> None:
    who = describe_plugin(pm, plugin_name)
    if not isinstance(path, (str, Path)) or not str(path).endswith(".toml"):
        raise PluginError(
            f"{who}: passkit_register_pipelines returned {_describe_value(path)}, not a path to a .toml file"
        )
    path = Path(path)
    key = f"pipeline:{path.stem}"
    if path.stem in registry.pipelines:
        raise PluginError(
            f"duplicate pipeline name {path.stem!r}: shipped by {registry.providers[key]} "
            f"({registry.pipelines[path.stem]}) and {who} ({path})"
        )
    registry.pipelines[path.stem] = path
    registry.providers[key] = who
