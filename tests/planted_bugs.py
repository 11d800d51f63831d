"""Planted bugs for the debugging tests, importable as a plugin module (``--plugin planted_bugs``)
and as a model factory (``--model planted_bugs:tiny``), also from a fresh process.

``planted.scale_add`` multiplies the result of every floating-point addition by 1.001 (a miscompile that only
numerics catch); ``planted.explode`` raises. The pattern set ``planted`` does the same one add at a time
(pattern ``planted:scale_add``), for bisecting inside a ``rewrite`` step; ``--model planted_bugs:chain``
gives it company: views and multiplications by one that the good ``noops`` set removes first.
"""

from __future__ import annotations

import torch
from torch import nn

import passkit
from passkit.core.hookspecs import hookimpl
from passkit.patterns import Op, Pattern, PatternSet, Var

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


def _not_scaled_yet(match) -> bool:
    """Refuse the add this pattern put in itself (its only user is the scaling), so it stops."""
    users = list(match.roots[0].users)
    scaled = len(users) == 1 and users[0].target is torch.ops.aten.mul.Tensor and users[0].args[1:] == (SCALE,)
    value = match.roots[0].meta.get("val")
    return not scaled and value is not None and value.dtype.is_floating_point


def _scaled_add(builder, x, y):
    aten = torch.ops.aten
    return builder.call(aten.mul.Tensor, builder.call(aten.add.Tensor, x, y), SCALE)


SCALE_ADD_PATTERN = Pattern(
    "scale_add", Op(torch.ops.aten.add.Tensor, Var("x"), Var("y")), build=_scaled_add, check=_not_scaled_yet,
    description="miscompile on purpose: x + y becomes (x + y) * 1.001",
)


@hookimpl
def passkit_register_patterns() -> dict:
    return {"planted": PatternSet("planted", (SCALE_ADD_PATTERN,), "a bad pattern, planted for the bisect tests")}


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


class Chain(nn.Module):
    """Two layers with residual adds, and views and multiplications by one for ``noops``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = h.reshape(h.shape) * 1
        h = torch.relu(h) + x
        h = self.fc2(h).reshape(h.shape) * 1
        return torch.tanh(h) + h


def chain() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Chain(), (torch.randn(4, 8),)


class Dropped(nn.Module):
    """``Linear → Dropout(0.3) → Linear`` with a residual add (for ``planted.scale_add``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.fc1(x))) + x


def dropout() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A model with dropout, in train mode: every check must draw eager's mask."""
    torch.manual_seed(0)
    return Dropped().train(), (torch.randn(4, 8),)
