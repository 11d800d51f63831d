"""Own a small SimpleFSDP: parameters sharded as DTensors, gathered inside the traced graph.

TorchTitan's SimpleFSDP keeps each parameter as a ``Shard(0)`` DTensor and reads it through a
parametrization that calls ``redistribute([Replicate()]).to_local(grad_placements=[Partial])``.
Traced, the forward holds one ``all_gather_into_tensor`` per parameter and the backward one
``reduce_scatter_tensor`` per gradient, so graph passes (``collectives.bucket``,
``collectives.overlap``, ``collectives.reshard``) have collectives to work on. FSDP2's
``fully_shard`` gathers in hooks outside the graph instead.

``simple_fsdp(module, mesh)`` shards a module in place; ``mlp_stack(layers, dim)`` is the
stack the tests and ``benchmarks/overlap.py`` use. Needs an initialised process group.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["ReplicateComputation", "simple_fsdp", "Layer", "mlp_stack"]


class ReplicateComputation(nn.Module):
    """What a sharded parameter reads as: the whole tensor, gathered; its gradient averaged."""

    def forward(self, shard: Any) -> torch.Tensor:
        from torch.distributed.tensor import Partial, Replicate

        return shard.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial("avg")])


def _parametrized_class(cls: type, names: list[str], compute: nn.Module) -> type:
    # A property per parameter on a per-instance subclass, as SimpleFSDP does: torch's
    # parametrize module caches and wraps more than a traced graph wants to see.
    def getter(name: str) -> property:
        return property(lambda self: compute(self._parameters[name]))

    return type(f"FSDP{cls.__name__}", (cls,), {name: getter(name) for name in names})


def simple_fsdp(module: nn.Module, mesh: Any) -> nn.Module:
    """Shard every parameter of ``module`` along dim 0 over ``mesh``, gathered on each read."""
    from torch.distributed.tensor import Shard, distribute_tensor

    compute = ReplicateComputation()
    for mod in list(module.modules()):
        names = [name for name, p in mod.named_parameters(recurse=False) if p is not None and p.numel() > 0]
        if not names:
            continue
        for name in names:
            param = mod._parameters[name]
            mod._parameters[name] = nn.Parameter(distribute_tensor(param.detach(), mesh, [Shard(0)]))
        mod.__class__ = _parametrized_class(type(mod), names, compute)
    return module


class Layer(nn.Module):
    """A residual MLP layer: four parameters, so four gathers and four reduce-scatters."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def mlp_stack(layers: int = 4, dim: int = 64, hidden: int | None = None, *, seed: int = 0) -> nn.Sequential:
    """``layers`` residual MLP layers, the same weights on every rank (seeded)."""
    torch.manual_seed(seed)
    return nn.Sequential(*(Layer(dim, hidden or 4 * dim) for _ in range(layers)))
