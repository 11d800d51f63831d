"""Compiled training under DDP and FSDP2 gives the eager wrapper's gradients.

Two gloo ranks on the CPU; ``bucket_cap_mb`` is small enough that Dynamo's DDP optimizer splits
the two-block model into several graphs, each compiled by passkit on the fake outputs of the
piece before it. Parameters stay graph inputs: a later optimizer step changes what the compiled
model computes. FSDP2 (``fully_shard`` per block, gloo on the CPU) is compared the same way on
the full gradients.
"""

from __future__ import annotations

import copy
import datetime
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytestmark = pytest.mark.slow

# Dynamo's DDP optimizer needs buckets of at least DDP's first bucket (1 MB); two blocks this
# wide hold about 1.6 MB of parameters, so 1 MB buckets split them.
DIM = 128
BUCKET_MB = 1


def _model() -> nn.Module:
    from passkit.examples.transformer import Block

    torch.manual_seed(0)
    return nn.Sequential(Block(DIM, 4), Block(DIM, 4), nn.Linear(DIM, 8))


def _wrap(model: nn.Module, wrapper: str) -> nn.Module:
    if wrapper == "ddp":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    from torch.distributed.fsdp import fully_shard

    for block in model[:2]:
        fully_shard(block)
    return fully_shard(model)


def _full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad.clone()


def sgd_steps_side_by_side(eager: nn.Module, twin: nn.Module, compiled: Any, rank: int, dim: int) -> list[Any]:
    """Two SGD steps of the eager model and of its compiled twin on the same per-rank batches:
    each step's output and full gradients, eager's then the twin's."""
    steps = []
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin)]
    for step in range(2):
        torch.manual_seed(100 + 10 * step + rank)
        x = torch.randn(2, 8, dim)
        for model, runner, optimizer in ((eager, eager, optimizers[0]), (twin, compiled, optimizers[1])):
            optimizer.zero_grad()
            out = runner(x)
            out.square().mean().backward()
            steps.append((out.detach(), [_full(p.grad) for p in model.parameters()]))
            optimizer.step()
    return steps


def _rank_main(rank: int, world: int, init_method: str, out_dir: str, wrapper: str) -> None:
    import passkit

    # A collective that waits longer than this raises instead of hanging (spawn_ranks has its own deadline).
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        torch.set_num_threads(1)
        base = _model()
        eager, twin = _wrap(copy.deepcopy(base), wrapper), _wrap(copy.deepcopy(base), wrapper)
        backend = passkit.backend("training-python")
        compiled = torch.compile(twin, backend=backend)
        results = {"graphs": 0, "steps": sgd_steps_side_by_side(eager, twin, compiled, rank, DIM)}
        results["graphs"] = len(backend.reports)
        results["ran"] = [[r.id for r in report.records if r.status == "ran"] for report in backend.reports]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_compiled_training_matches_the_eager_wrapper(tmp_path, spawn_ranks, wrapper: str) -> None:
    world = 2
    spawn_ranks(_rank_main, str(tmp_path), wrapper, world=world)
    for rank in range(world):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        if wrapper == "ddp":
            assert results["graphs"] >= 2, "the DDP optimizer should have split the model into several graphs"
        assert all("joint" in ran and "codegen.python" in ran for ran in results["ran"])
        steps = results["steps"]
        for step in range(0, len(steps), 2):
            (out_e, grads_e), (out_c, grads_c) = steps[step], steps[step + 1]
            torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
            for i, (g_e, g_c) in enumerate(zip(grads_e, grads_c)):
                torch.testing.assert_close(g_c, g_e, rtol=1e-5, atol=1e-5, msg=lambda m: f"rank {rank} step {step // 2} grad {i}: {m}")
