"""``passkit bisect`` names a gradient as ``passkit run`` does, by what it is the gradient of
(``grad[norm2.weight]``), not by its position among the inputs that need one (``grad[6]``)."""

from __future__ import annotations

from pathlib import Path

import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main

aten = torch.ops.aten


@passkit.graph_pass("test.tanh_gelu", requires={"functional"}, tolerance=(1e-3, 1e-3))
def tanh_gelu(program: passkit.Program) -> bool:
    """GELU as its tanh form: the outputs stay within 1e-3, the gradients do not."""
    changed = False
    for gm in program.graphs.values():
        for node in gm.graph.nodes:
            if node.target is aten.gelu.default and node.kwargs.get("approximate", "none") == "none":
                node.update_kwarg("approximate", "tanh")
                changed = True
        gm.recompile()
    return changed


class Plugin:
    @passkit.hookimpl
    def passkit_register_passes(self) -> list:
        return [tanh_gelu]


def test_bisect_and_run_name_the_same_gradient(register_passkit_plugin) -> None:
    register_passkit_plugin(Plugin(), name="tanh")
    Path("tanh.toml").write_text('[pipeline]\nname = "tanh"\nextends = "training-python"\n\n'
                                 '[[steps]]\npass = "test.tanh_gelu"\nafter = "functionalize"\n')
    ran = CliRunner().invoke(main, ["run", "tanh.toml"])
    assert ran.exit_code == 1 and "first mismatch: grad[norm2.weight]: max |diff| " in ran.stdout, ran.output
    bisected = CliRunner().invoke(main, ["bisect", "tanh.toml"])
    assert bisected.exit_code == 1, bisected.output
    blame = bisected.stdout.splitlines()[1]
    assert blame.startswith("  graph 1, training: numerics: changed numerics: max |diff| ")
    assert blame.endswith(" in grad[norm2.weight] of graph main (rtol 0.001, atol 0.001)")
