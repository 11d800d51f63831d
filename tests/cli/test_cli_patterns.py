"""`passkit patterns`: the registered pattern sets as an aligned table and as JSON."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main
from passkit.patterns import Op, Pattern, PatternSet, Var
from passkit.core.plugins import make_plugin_manager
from passkit.core.registry import build_registry

aten = torch.ops.aten
LONG = "a_plugin_with_a_long_name:exact_gelu_to_its_tanh_approximation"


def _keep(builder, x):
    return x


def _pattern(name: str) -> Pattern:
    return Pattern(name, Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=_keep)


class SetsPlugin:
    @passkit.hookimpl
    def passkit_register_patterns(self) -> dict:
        return {
            "short": PatternSet("short", (_pattern("double_neg"),), "two negations cancel", tolerance=(1e-3, 1e-3)),
            LONG: [_pattern("double_neg")],  # a plain list: no description
            "twice": [_pattern("double_neg"), _pattern("double_neg")],
        }


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch):
    pm = make_plugin_manager(load_entry_points=False, builtins=False)
    pm.register(SetsPlugin(), name="sets")
    built = build_registry(pm)
    monkeypatch.setattr("passkit.core.registry.get_registry", lambda: built)
    return built


def test_a_long_name_without_a_description_keeps_the_columns_aligned(registry) -> None:
    result = CliRunner().invoke(main, ["patterns"])
    assert result.exit_code == 0, result.output
    width = len(LONG)
    plugin = "plugin 'sets' (not from an installed distribution)"
    invalid = "invalid: ValueError: pattern set 'twice' has two patterns named 'twice:double_neg'"
    tolerance = "rtol=0.001, atol=0.001"
    rows = [
        ("name", "patterns", "options", "tolerance", "plugin", "description"),
        ("-" * width, "--------", "-------", "-" * len(tolerance), "-" * len(plugin), "-" * len(invalid)),
        (LONG, "1", "", "", plugin, ""),
        ("short", "1", "", tolerance, plugin, "two negations cancel"),
        ("twice", "0", "", "", plugin, invalid),
    ]
    widths = [width, 8, 7, len(tolerance), len(plugin), len(invalid)]
    expected = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    assert result.stdout.splitlines() == expected


def test_json_lists_each_set_with_its_patterns(registry) -> None:
    result = CliRunner().invoke(main, ["patterns", "--json"])
    assert result.exit_code == 0, result.output
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert sorted(listed) == [LONG, "short", "twice"]
    assert [p["name"] for p in listed[LONG]["patterns"]] == [f"{LONG}:double_neg"]
    assert listed["short"]["description"] == "two negations cancel"
    assert listed["short"]["tolerance"] == {"rtol": 1e-3, "atol": 1e-3}
    assert listed[LONG]["tolerance"] is None
