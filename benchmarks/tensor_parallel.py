"""Step time of a tensor-parallel transformer block: eager, Inductor and passkit, on gloo ranks.

The block is attention (q, k, v column-wise, the output projection row-wise) followed by an MLP
(up column-wise, down row-wise), d=256, 4 heads, sharded with ``parallelize_module`` over a
one-dimensional mesh of ``--world`` CPU ranks (gloo), each rank on one thread. A step is: zero
the grads, forward, ``loss = (out ** 2).mean()``, backward. Contenders: ``eager``,
``inductor`` (``torch.compile``) and ``passkit:<pipeline>`` for each pipeline named (default
``training``); each holds its own copy of the sharded model.

Method, as ``step_time.py``: compile time is each contender's first step; after two warm-up
steps the contenders are timed round by round in an order that rotates each round (the same
order on every rank, since every step runs collectives), and rank 0 reports the median per
contender and its ratios to eager and to Inductor. Every compiled contender's first-step
outputs and gradients are compared with eager's on every rank before timing.

Run: ``python benchmarks/tensor_parallel.py [PIPELINE ...] [--world 2] [--rounds 20] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

DIM, HEADS, BATCH, SEQ = 256, 4, 8, 128


class Block(nn.Module):
    """Pre-norm attention and MLP; the layer norms are replicated, the projections sharded."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.norm1(x)
        # -1 heads: each rank holds its share of them.
        q, k, v = (proj(h).view(batch, seq, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


def _sharded(mesh: Any) -> nn.Module:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    plan = {name: ColwiseParallel() for name in ("q", "k", "v", "up")}
    plan.update(o=RowwiseParallel(), down=RowwiseParallel())
    return parallelize_module(Block(), mesh, plan)


def _runner(name: str, model: nn.Module) -> Callable[..., Any]:
    import passkit

    if name == "eager":
        return model
    if name == "inductor":
        return torch.compile(model, backend="inductor")
    return torch.compile(model, backend=passkit.backend(name.removeprefix("passkit:"), cache="off"))


def _step(model: nn.Module, runner: Callable[..., Any], x: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = runner(x)
    (out ** 2).mean().backward()
    # Layer norms stay replicated plain tensors; the projections' gradients are DTensors.
    return out.detach(), {n: getattr(p.grad, "to_local", p.grad.detach)() for n, p in model.named_parameters()}


def _rank_main(rank: int, world: int, init_file: str, contenders: list[str], rounds: int, out_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        mesh = init_device_mesh("cpu", (world,))
        base = _sharded(mesh)
        torch.manual_seed(1)  # the same input on every rank, as tensor parallelism expects
        x = torch.randn(BATCH, SEQ, DIM)
        models = {name: copy.deepcopy(base) for name in contenders}
        runners = {name: _runner(name, models[name]) for name in contenders}
        compile_s, mismatches = {}, []
        expected = _step(models["eager"], runners["eager"], x)
        for name in contenders:
            started = time.perf_counter()
            out, grads = _step(models[name], runners[name], x)
            compile_s[name] = time.perf_counter() - started
            if name != "eager":
                worst = max([float((out - expected[0]).abs().max())]
                            + [float((grads[n] - g).abs().max()) for n, g in expected[1].items()])
                if not worst <= 1e-4:
                    mismatches.append(f"{name}, rank {rank}: max |diff| {worst:.3g}")
            for _ in range(2):
                _step(models[name], runners[name], x)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for index in range(rounds):
            shift = index % len(contenders)
            for name in contenders[shift:] + contenders[:shift]:
                started = time.perf_counter()
                _step(models[name], runners[name], x)
                times[name].append(time.perf_counter() - started)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mismatches)
        if rank == 0:
            result = {"compile_s": compile_s, "median_s": {n: statistics.median(t) for n, t in times.items()},
                      "mismatches": [m for ms in gathered for m in ms]}
            with open(out_path, "w") as handle:
                json.dump(result, handle)
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", default=["training"])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    contenders = ["eager", "inductor", *(f"passkit:{p}" for p in args.pipelines)]
    with tempfile.TemporaryDirectory() as scratch:
        out_path = os.path.join(scratch, "result.json")
        mp.spawn(_rank_main, args=(args.world, os.path.join(scratch, "init"), contenders, args.rounds, out_path),
                 nprocs=args.world)
        with open(out_path) as handle:
            result = json.load(handle)
    median = result["median_s"]
    print(f"tensor-parallel block d={DIM}, {args.world} gloo ranks x 1 thread, input ({BATCH}, {SEQ}, {DIM}), "
          f"{args.rounds} rounds, torch {torch.__version__}")
    print(f"{'contender':24s} {'compile':>9s} {'step (median)':>14s} {'/ eager':>8s} {'/ inductor':>11s}")
    for name in contenders:
        print(f"{name:24s} {result['compile_s'][name]:8.2f}s {median[name] * 1e3:12.2f}ms "
              f"{median[name] / median['eager']:8.3f} {median[name] / median['inductor']:11.3f}")
    for mismatch in result["mismatches"]:
        print(f"MISMATCH {mismatch}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({**result, "contenders": contenders, "world": args.world}, handle, indent=2)
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
