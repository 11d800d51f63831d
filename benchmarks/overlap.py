"""Collectives bucketed and overlapped: an 8-layer SimpleFSDP stack on gloo ranks.

The model is ``passkit.examples.simple_fsdp``: 8 residual MLP layers (d=256, hidden 1024),
every parameter a ``Shard(0)`` DTensor gathered in the forward and reduce-scattered in the
backward, inside the traced graph. A step is: zero the grads, forward on a (256, 256) batch of
the rank's own, ``loss = (out ** 2).mean()``, backward. Each rank runs on one thread.

Contenders: ``eager``; ``passkit:<pipeline>-off``, the pipeline with ``collectives.reshard``,
``collectives.bucket`` and ``collectives.overlap`` disabled; ``passkit:<pipeline>``, with them
(default ``training``); ``inductor``, ``torch.compile`` with ``aten_distributed_optimizations``
(overlap scheduling and bucketing) where it compiles on the CPU, else plain Inductor, named so.

Figures, per contender: the collectives each step issues, per kind (from the profiler: calls
of ``_c10d_functional`` ops); the exposed waits in passkit's graphs (no compute between a
collective and its wait; read before code generation by a step this script adds); the time
the ranks' threads spend in ``_c10d_functional::wait_tensor`` per step (the profiler's exposed
communication), median over the profiled rounds; and the step time, median over interleaved
rounds (the contenders' order rotates each round, the same on every rank). Every compiled
contender's first-step gradients are compared with eager's on every rank before timing.

Run: ``python benchmarks/overlap.py [--pipeline training] [--world 2] [--rounds 10] [--json OUT]``.
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
from collections import Counter
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYERS, DIM, HIDDEN, BATCH = 8, 256, 1024, 256
PASSES = ["collectives.reshard", "collectives.bucket", "collectives.overlap"]
COLLECTIVES = {"_c10d_functional::all_gather_into_tensor": "all_gather",
               "_c10d_functional::all_gather_into_tensor_out": "all_gather",
               "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
               "_c10d_functional::all_reduce": "all_reduce"}
WAIT = "_c10d_functional::wait_tensor"


def _graph_figures(store: dict[str, Any]) -> Any:
    import passkit
    from passkit.passes.collectives_bucket import count_collectives
    from passkit.passes.collectives_overlap import exposed_waits

    @passkit.graph_pass("bench.figures")
    def figures(program: passkit.Program) -> bool:
        """Exposed waits in the graphs code generation gets."""
        for name in ("forward", "backward", "main"):
            if name in program.graphs:
                gm = program.graphs[name]
                store[name] = {"exposed_waits": len(exposed_waits(gm)), **count_collectives(gm)}
        return False

    return figures


def _contenders(pipeline: str) -> dict[str, tuple[Callable[[Any], Any], dict[str, Any]]]:
    import passkit

    def passkit_with(disabled: list[str]) -> Callable[[Any], tuple[Any, dict[str, Any]]]:
        def build(model: Any) -> tuple[Any, dict[str, Any]]:
            store: dict[str, Any] = {}
            spec = {"pipeline": {"extends": pipeline, "disable": disabled},
                    "steps": [{"pass": _graph_figures(store), "before": _codegen(pipeline)}]}
            return torch.compile(model, backend=passkit.backend(spec)), store
        return build

    def inductor(model: Any) -> tuple[Any, dict[str, Any]]:
        from torch._inductor import config

        config.aten_distributed_optimizations.enable_overlap_scheduling = True
        config.aten_distributed_optimizations.collective_bucketing = True
        return torch.compile(model), {}

    return {"eager": lambda m: (m, {}), f"passkit:{pipeline}-off": passkit_with(PASSES),
            f"passkit:{pipeline}": passkit_with([]), "inductor+overlap": inductor}


def _codegen(pipeline: str) -> str:
    return "codegen.python" if pipeline.endswith("python") else "codegen.inductor"


def _step(runner: Any, model: Any, x: torch.Tensor) -> None:
    for p in model.parameters():
        p.grad = None
    runner(x).square().mean().backward()


def _profiled(runner: Any, model: Any, x: torch.Tensor) -> tuple[float, Counter[str]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _step(runner, model, x)
    wait_us, calls = 0.0, Counter()
    for event in prof.events():
        if event.name == WAIT:
            wait_us += event.cpu_time_total
        elif event.name in COLLECTIVES:
            calls[COLLECTIVES[event.name]] += 1
    return wait_us / 1000, calls


def _rank_main(rank: int, world: int, init: str, out: str, pipeline: str, rounds: int) -> None:
    from passkit.examples.simple_fsdp import mlp_stack, simple_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    base = mlp_stack(LAYERS, DIM, HIDDEN)
    torch.manual_seed(100 + rank)
    x = torch.randn(BATCH, DIM)
    runners: dict[str, tuple[Any, Any]] = {}
    result: dict[str, Any] = {}
    reference = None
    for name, build in _contenders(pipeline).items():
        model = simple_fsdp(copy.deepcopy(base), mesh)
        torch._dynamo.reset()
        runner, store = build(model)
        start = time.perf_counter()
        try:
            _step(runner, model, x)
        except Exception as exc:  # Inductor's overlap scheduling on the CPU
            if name != "inductor+overlap":
                raise
            from torch._inductor import config

            config.aten_distributed_optimizations.enable_overlap_scheduling = False
            config.aten_distributed_optimizations.collective_bucketing = False
            result["inductor_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            name = "inductor"
            torch._dynamo.reset()
            model = simple_fsdp(copy.deepcopy(base), mesh)
            runner, store = torch.compile(model), {}
            start = time.perf_counter()
            _step(runner, model, x)
        grads = [p.grad.to_local().clone() for p in model.parameters()]
        if reference is None:
            reference = grads
        for i, (g, g_e) in enumerate(zip(grads, reference)):
            torch.testing.assert_close(g, g_e, rtol=1e-4, atol=1e-5, msg=lambda m: f"rank {rank} {name} grad {i}: {m}")
        result[name] = {"compile_s": time.perf_counter() - start, "graphs": store, "wait_ms": [], "step_ms": []}
        runners[name] = (runner, model)
    names = list(runners)
    for name in names:  # warm-up
        for _ in range(2):
            _step(*runners[name], x)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            runner, model = runners[name]
            wait_ms, calls = _profiled(runner, model, x)
            result[name]["wait_ms"].append(wait_ms)
            result[name]["calls"] = dict(calls)
            start = time.perf_counter()
            for _ in range(3):
                _step(runner, model, x)
            result[name]["step_ms"].append((time.perf_counter() - start) / 3 * 1000)
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name in [k for k in results[0] if k != "inductor_error"]:
        per_rank = [r[name] for r in results]
        graphs = per_rank[0]["graphs"]
        rows.append({
            "contender": name,
            "collectives": per_rank[0].get("calls", {}),
            "exposed_waits": sum(g["exposed_waits"] for g in graphs.values()) if graphs else None,
            "wait_ms": [round(statistics.median(r["wait_ms"]), 2) for r in per_rank],
            "wait_ms_all_ranks": round(sum(statistics.median(r["wait_ms"]) for r in per_rank), 1),
            "step_ms": [round(statistics.median(r["step_ms"]), 1) for r in per_rank],
            "compile_s": round(max(r["compile_s"] for r in per_rank), 1),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="training")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        init = f"file://{out}/rendezvous"
        mp.start_processes(_rank_main, args=(args.world, init, out, args.pipeline, args.rounds),
                           nprocs=args.world, start_method="spawn")
        results = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(args.world)]
    rows = _table(results)
    print(f"{LAYERS}-layer SimpleFSDP stack, d={DIM}, hidden {HIDDEN}, batch {BATCH}, {args.world} gloo ranks, "
          f"{args.rounds} interleaved rounds; per rank: wait ms, step ms (medians)")
    print(f"{'contender':<28} {'collectives per step':<32} {'exposed':>7}  {'wait ms (sum)':<24} {'step ms':<14} compile s")
    for row in rows:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(row["collectives"].items()))
        exposed = "-" if row["exposed_waits"] is None else str(row["exposed_waits"])
        waits = f"{'/'.join(map(str, row['wait_ms']))} ({row['wait_ms_all_ranks']})"
        print(f"{row['contender']:<28} {kinds:<32} {exposed:>7}  {waits:<24} "
              f"{'/'.join(map(str, row['step_ms'])):<14} {row['compile_s']}")
    if "inductor_error" in results[0]:
        print(f"inductor with aten_distributed_optimizations failed on the CPU: {results[0]['inductor_error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "inductor_error": results[0].get("inductor_error")}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
