"""Planted bugs for the debugging tests, importable as a plugin module (``--plugin planted_bugs``)
and as a model factory (``--model planted_bugs:tiny``), also from a fresh process.

``planted.scale_add`` multiplies the result of every floating-point addition by 1.001 (a miscompile that only
numerics catch); ``planted.explode`` raises.
"""

from __future__ import annotations

import torch
from torch import nn

import passkit
from passkit.hookspecs import hookimpl

SCALE = 1.001


@passkit.graph_pass("planted.scale_add", requires={"functional"})
def scale_add(program: passkit.Program) -> bool:
    """Miscompile on purpose: scale the result of every floating aten.add.Tensor by 1.001."""
    changed = False
    for gm in program.graphs.values():
        for node in list(gm.graph.nodes):
            value = node.meta.get("val")
            if node.target is torch.ops.aten.add.Tensor and value is not None and value.dtype.is_floating_point:
                with gm.graph.inserting_after(node):
                    scaled = gm.graph.call_function(torch.ops.aten.mul.Tensor, (node, SCALE))
                node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
                changed = True
        gm.recompile()
    return changed


@passkit.graph_pass("planted.explode")
def explode(program: passkit.Program) -> bool:
    """Fail on purpose."""
    raise RuntimeError("planted failure")


@hookimpl
def passkit_register_passes() -> list:
    return [scale_add, explode]


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


def tiny() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A linear layer with a residual add: the add is what ``planted.scale_add`` breaks."""
    torch.manual_seed(0)
    return Tiny(), (torch.randn(4, 8),)
