"""``passkit bisect --inductor``: the first bad step of a mounted file, and the first bad rewrite
inside it, found inside stock ``torch.compile``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import passkit

MODEL_SOURCE = '''
import torch


def factory():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3), torch.nn.ReLU())
    return model, (torch.randn(5, 4),)
'''


@pytest.mark.slow
def test_bisect_inductor_names_the_first_bad_step_and_rewrite_inside_stock_torch_compile(
    tmp_path: Path, monkeypatch, register_passkit_plugin
) -> None:
    from click.testing import CliRunner

    from passkit.cli import main

    @passkit.graph_pass("test.relu_to_abs", requires={"functional"})
    def relu_to_abs(program: passkit.Program, *, context: passkit.StepContext | None = None) -> bool:
        """Rewrite relu to abs (wrong on purpose), asking before each rewrite."""
        changed = False
        for name, gm in program.graphs.items():
            for node in gm.graph.nodes:
                if node.target is torch.ops.aten.relu.default and (context is None or context.should_apply(
                        kind="pattern", name="bugs:relu_abs", group="bugs", graph=name, nodes=(node.name,))):
                    node.target = torch.ops.aten.abs.default
                    changed = True
            gm.recompile()
        return changed

    class Plugin:
        @passkit.hookimpl
        def passkit_register_passes(self):
            return [relu_to_abs]

    register_passkit_plugin(Plugin(), name="test-bugs")
    (tmp_path / "slot_bisect_model.py").write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "buggy.toml"
    path.write_text(textwrap.dedent("""
        [[steps]]
        pass = "fx.cse"
        slot = "post_grad_pre"

        [[steps]]
        pass = "partition.min_cut"

        [[steps]]
        pass = "test.relu_to_abs"
        slot = "post_grad_post"
    """))
    done = CliRunner().invoke(main, ["bisect", str(path), "--inductor", "--model", "slot_bisect_model:factory"])
    assert done.exit_code == 1, done.output
    lines = done.output.strip().splitlines()
    assert f"first bad step: {path}: steps[2] (test.relu_to_abs) (slot post_grad_post)" in lines
    # The forward has both relus, the backward none: the first one rewritten is the first bad.
    assert any(line.startswith("  first bad pattern application: bugs:relu_abs (application 1 of 2), graph forward, ")
               for line in lines), lines
