"""The planted GELU case of the tolerance tests, importable as a plugin module (``--plugin
planted_gelu``) and as a model factory (``--model planted_gelu:mlp``), also from a fresh process.

``planted.gelu_tanh`` replaces exact GELU (``aten.gelu`` without ``approximate``) with its tanh
approximation and declares ``tolerance=(1e-3, 1e-4)``; ``planted.gelu_tanh_loose`` is the same
rewrite declaring ``(5e-2, 1e-2)``. The pattern set ``planted_gelu`` does the same rewrite as a
pattern and declares ``(5e-2, 1e-2)``; ``planted_gelu_undeclared`` declares nothing. ``mlp`` is scaled so that the approximation moves its
results by clearly more than the first tolerance allows and clearly less than the second.
"""

from __future__ import annotations

import torch
from torch import nn

import passkit
from passkit.core.hookspecs import hookimpl
from passkit.patterns import Op, Pattern, PatternSet, Var

TIGHT = (1e-3, 1e-4)
LOOSE = (5e-2, 1e-2)


def _tanh_gelu(program: passkit.Program) -> bool:
    changed = False
    for gm in program.graphs.values():
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.gelu.default and node.kwargs.get("approximate", "none") == "none":
                node.kwargs = {**node.kwargs, "approximate": "tanh"}
                changed = True
        gm.recompile()
    return changed


@passkit.graph_pass("planted.gelu_tanh", requires={"functional"}, tolerance=TIGHT)
def gelu_tanh(program: passkit.Program) -> bool:
    """Replace exact GELU with its tanh approximation (declares rtol 1e-3, atol 1e-4)."""
    return _tanh_gelu(program)


@passkit.graph_pass("planted.gelu_tanh_loose", requires={"functional"}, tolerance=LOOSE)
def gelu_tanh_loose(program: passkit.Program) -> bool:
    """Replace exact GELU with its tanh approximation (declares rtol 5e-2, atol 1e-2)."""
    return _tanh_gelu(program)


@hookimpl
def passkit_register_passes() -> list:
    return [gelu_tanh, gelu_tanh_loose]


def _tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def _exact(match) -> bool:
    return match.roots[0].kwargs.get("approximate", "none") == "none"


GELU_TANH_PATTERN = Pattern("gelu_tanh", Op(torch.ops.aten.gelu.default, Var("x")), replace=_tanh, check=_exact)


@hookimpl
def passkit_register_patterns() -> dict:
    return {
        "planted_gelu": PatternSet("planted_gelu", (GELU_TANH_PATTERN,), "exact GELU -> tanh GELU", tolerance=LOOSE),
        "planted_gelu_undeclared": PatternSet("planted_gelu_undeclared", (GELU_TANH_PATTERN,), "the same, declaring nothing"),
    }


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Inputs of a few units, where the tanh form is furthest from the exact one."""
    torch.manual_seed(0)
    return Mlp(), (torch.randn(8, 16) * 4,)


def mlp_grads() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A Linear -> GELU -> Linear (d=32) at PyTorch's initialisation on a rank-3 input: the tanh
    form moves its outputs by less than (1e-3, 1e-4) allows, and its weight gradients by more."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32)), (torch.randn(2, 8, 32),)
