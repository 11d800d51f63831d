"""Own the plugin manager: built-ins first, then the ``passkit`` entry points, then a pending check.

Built-in facts, passes, instruments and pipelines are plugins loaded through the same manager
and hooks as third-party code. ``BUILTIN_PLUGINS`` is their one list (passkit's own
distribution declares no ``passkit`` entry points, so installed metadata cannot drift from it).
The essential ones (the built-in facts and the step that applies a pass) cannot be blocked and
are registered even in a manager built without the other built-ins: without them no pipeline
means anything.
A plugin that fails to import (or to register) is reported on stderr as one line naming the
plugin and its distribution, recorded in ``failed_plugins``, and every other plugin still loads.

Environment switches:

- ``PASSKIT_DISABLE_PLUGINS=a,b`` blocks plugins by name before anything is imported.
- ``PASSKIT_TRACE_PLUGINS=1`` prints every hook call and its result to stderr.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import sys
from typing import Any

import pluggy

from passkit.core import hookspecs
__all__ = [
    "BUILTIN_PLUGINS",
    "ESSENTIAL_PLUGINS",
    "PasskitPluginManager",
    "make_plugin_manager",
    "get_plugin_manager",
    "reset",
    "describe_plugin",
    "blocked_plugin_names",
]

# (plugin name, module), in registration order. The instruments' order is their wrapper order,
# innermost first (see passkit.core.hookspecs).
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("core_facts", "passkit.passes.core_facts"),
    ("apply_pass", "passkit.passes.apply"),
    ("regions", "passkit.regions.outline"),
    ("functionalize", "passkit.passes.functionalize"),
    ("decompose", "passkit.passes.decompose"),
    ("joint", "passkit.passes.joint"),
    ("joint_inductor", "passkit.passes.joint_inductor"),
    ("partition", "passkit.passes.partition"),
    ("partition_min_cut", "passkit.passes.partition_min_cut"),
    ("fx_cleanup", "passkit.passes.fx_cleanup"),
    ("edge", "passkit.passes.edge"),
    ("collectives_reshard", "passkit.passes.collectives_reshard"),
    ("collectives_bucket", "passkit.passes.collectives_bucket"),
    ("collectives_overlap", "passkit.passes.collectives_overlap"),
    ("codegen_python", "passkit.passes.codegen_python"),
    ("codegen_inductor", "passkit.passes.codegen_inductor"),
    ("timing", "passkit.instruments.timing"),
    ("dumps", "passkit.instruments.dumps"),
    ("verify", "passkit.instruments.verify"),
    ("repro", "passkit.instruments.repro"),
    ("progress", "passkit.instruments.progress"),
    ("html_report", "passkit.instruments.html_report"),
    ("structured_trace", "passkit.instruments.structured_trace"),
    ("shipped_pipelines", "passkit.passes.shipped_pipelines"),
    ("rewrite", "passkit.passes.rewrite"),
    ("reinplace", "passkit.passes.reinplace"),
)
ESSENTIAL_PLUGINS = ("core_facts", "apply_pass")

DISABLE_ENV = "PASSKIT_DISABLE_PLUGINS"
TRACE_ENV = "PASSKIT_TRACE_PLUGINS"
ENTRY_POINT_GROUP = "passkit"

_cached_manager: PasskitPluginManager | None = None


class PasskitPluginManager(pluggy.PluginManager):
    """A pluggy manager that also remembers each plugin's distribution and load failures."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.distributions: dict[str, tuple[str, str]] = {}
        self.failed_plugins: dict[str, str] = {}

    def register_plugin(self, plugin: Any, name: str, *, distribution: tuple[str, str] | None = None) -> str | None:
        """Register ``plugin`` under ``name``, remembering its (distribution, version).

        Returns the name, or None when the name is blocked.
        """
        registered = self.register(plugin, name=name)
        if registered is not None and distribution is not None:
            self.distributions[name] = distribution
        return registered

    def record_failure(self, name: str, reason: str) -> None:
        """Remember and report (one stderr line) a plugin that could not be loaded."""
        self.failed_plugins[name] = reason
        print(f"passkit: {describe_plugin(self, name)} {reason}", file=sys.stderr)


def describe_plugin(pm: pluggy.PluginManager, name: str) -> str:
    """Render ``plugin 'acme' (acme-passes 1.0)`` for messages that must name a distribution."""
    dist = pm.distributions.get(name) if isinstance(pm, PasskitPluginManager) else None
    if dist is None:
        return f"plugin {name!r} (not from an installed distribution)"
    dist_name, version = dist
    label = f"{dist_name} {version}" if version else dist_name
    return f"plugin {name!r} ({label})"


def blocked_plugin_names() -> list[str]:
    """Plugin names listed in ``PASSKIT_DISABLE_PLUGINS`` (comma-separated)."""
    raw = os.environ.get(DISABLE_ENV, "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def _passkit_distribution() -> tuple[str, str]:
    try:
        return ("passkit", importlib.metadata.version("passkit"))
    except importlib.metadata.PackageNotFoundError:
        from passkit import __version__

        return ("passkit", __version__)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _register_module(pm: PasskitPluginManager, name: str, module_name: str, distribution: tuple[str, str]) -> None:
    if pm.is_blocked(name) or pm.has_plugin(name):
        return
    pm.distributions[name] = distribution
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken plugin must not take the others down
        pm.record_failure(name, f"failed to import: {_one_line(exc)}")
        return
    _register_loaded(pm, name, module)


def _register_loaded(pm: PasskitPluginManager, name: str, plugin: Any) -> None:
    try:
        pm.register(plugin, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        pm.record_failure(name, f"failed to register: {_one_line(exc)}")


def _load_entry_points(pm: PasskitPluginManager) -> None:
    own = _passkit_distribution()[0]
    for entry_point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else "unknown"
        # passkit's built-ins are BUILTIN_PLUGINS; stale installed metadata must not add more.
        if dist_name == own:
            continue
        name = entry_point.name
        if pm.is_blocked(name) or pm.has_plugin(name) or name in pm.failed_plugins:
            continue
        pm.distributions[name] = (dist_name, dist.version if dist is not None else "")
        try:
            plugin = entry_point.load()
        except Exception as exc:  # a broken plugin must not take the others down
            pm.record_failure(name, f"failed to import: {_one_line(exc)}")
            continue
        _register_loaded(pm, name, plugin)


def _drop_unknown_hooks(pm: PasskitPluginManager) -> None:
    """Do what ``check_pending`` does, but unregister the offender instead of failing everyone."""
    known = [name for name in vars(pm.hook) if not name.startswith("_") and getattr(pm.hook, name).has_spec()]
    for hook_name in list(vars(pm.hook)):
        if hook_name.startswith("_"):
            continue
        caller = getattr(pm.hook, hook_name)
        if caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook or not pm.is_registered(impl.plugin):
                continue
            close = difflib.get_close_matches(hook_name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            name = impl.plugin_name
            pm.unregister(impl.plugin)
            pm.record_failure(name, f"failed to register: unknown hook {hook_name!r}{hint}")
    pm.check_pending()


def _install_tracing(pm: PasskitPluginManager) -> None:
    def before(hook_name: str, hook_impls: list, kwargs: dict) -> None:
        plugins = ", ".join(impl.plugin_name for impl in hook_impls)
        print(f"passkit-trace: {hook_name}({', '.join(kwargs)}) -> [{plugins}]", file=sys.stderr)

    def after(outcome: Any, hook_name: str, hook_impls: list, kwargs: dict) -> None:
        exc = outcome.exception
        result = _one_line(exc) if exc is not None else repr(outcome.get_result())
        print(f"passkit-trace: {hook_name} = {result[:200]}", file=sys.stderr)

    pm.add_hookcall_monitoring(before, after)


def make_plugin_manager(*, load_entry_points: bool = True, builtins: bool = True) -> PasskitPluginManager:
    """Build a fresh manager: built-ins, then the ``passkit`` entry points, then a pending check.

    ``builtins=False`` gives a manager with passkit's hookspecs and only the essential
    built-ins, for tests that register their own plugins.
    """
    pm = PasskitPluginManager()
    for name in blocked_plugin_names():
        if name in ESSENTIAL_PLUGINS:
            print(f"passkit: plugin {name!r} is essential and cannot be disabled", file=sys.stderr)
            continue
        pm.set_blocked(name)
    distribution = _passkit_distribution()
    for name, module_name in BUILTIN_PLUGINS:
        if builtins or name in ESSENTIAL_PLUGINS:
            _register_module(pm, name, module_name, distribution)
    if load_entry_points:
        _load_entry_points(pm)
    _drop_unknown_hooks(pm)
    if os.environ.get(TRACE_ENV, "") not in ("", "0"):
        _install_tracing(pm)
    return pm


def get_plugin_manager() -> PasskitPluginManager:
    """The process-wide manager, built on first use."""
    global _cached_manager
    if _cached_manager is None:
        _cached_manager = make_plugin_manager()
    return _cached_manager


def reset() -> None:
    """Drop the cached manager (and with it the cached registry); tests use this."""
    global _cached_manager
    _cached_manager = None
