"""Plugins that fail while passkit builds its registry: every other plugin still loads.

(Plugins that fail to import, or register a misspelt hook, are covered in tests/core/test_plugins.py.)
"""

from __future__ import annotations

import pytest

from passkit.errors import PasskitError
from passkit.core.hookspecs import hookimpl
from passkit.core.plugins import make_plugin_manager
from passkit.core.registry import build_registry


class RaisesWhileRegistering:
    @hookimpl
    def passkit_register_passes(self):
        raise ImportError("cannot import name 'fuse' from 'acme_kernels'")


class ReturnsTheWrongType:
    @hookimpl
    def passkit_register_pipelines(self):
        return ["not", "paths", 3]


def test_a_plugin_that_raises_in_a_register_hook_is_reported_and_skipped(capsys) -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(RaisesWhileRegistering(), name="acme-broken")
    registry = build_registry(pm)
    assert registry.failed_plugins["acme-broken"] == (
        "failed in passkit_register_passes: ImportError: cannot import name 'fuse' from 'acme_kernels'"
    )
    assert "codegen.python" in registry.passes  # the built-ins still loaded
    lines = [line for line in capsys.readouterr().err.splitlines() if "acme-broken" in line]
    assert lines == [
        "passkit: plugin 'acme-broken' (not from an installed distribution) failed in passkit_register_passes: ImportError: "
        "cannot import name 'fuse' from 'acme_kernels'"
    ]


def test_a_plugin_returning_the_wrong_type_is_a_one_line_error_naming_it() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(ReturnsTheWrongType(), name="acme-wrong")
    with pytest.raises(PasskitError) as caught:
        build_registry(pm)
    assert str(caught.value) == (
        "plugin 'acme-wrong' (not from an installed distribution): passkit_register_pipelines returned "
        "'not' (str), not a path to a .toml file"
    )
