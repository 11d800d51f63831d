"""Measure a pipeline file mounted in stock Inductor against plain ``torch.compile``.

Contenders, per workload (``step_time.py``'s models and training step):

- ``inductor``: ``torch.compile(model)``;
- ``mounted:<file>``: ``torch.compile(model, options=passkit.inductor_options(file))``
  (default file: the shipped ``inductor-post-grad``: passkit's ``partition.min_cut``, then
  ``fx.cse`` and the ``gemm`` and ``noops`` pattern sets post-grad).

Figures: the median and minimum step time over ``--rounds`` rounds (each round runs both, in an
order that alternates), the cold compile time (first step, Inductor's caches off, as in
``step_time.py``), and the bytes the compiled forward saves for the backward: every tensor
AOT Autograd hands to ``save_for_backward``, counted once per storage through
``torch.autograd.graph.saved_tensors_hooks``, parameters and inputs included (they are saved
by reference and cost nothing; ``activations`` leaves them out).

Run: ``python benchmarks/inductor_slots.py [FILE] [--workloads mlp,large,gpt2] [--rounds N]
[--threads 2] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import passkit  # noqa: E402
from step_time import WORKLOADS, WARMUP_STEPS, Contender, cold_kernel_cache, disable_compile_caches  # noqa: E402

DEFAULT_FILE = "inductor-post-grad"
DEFAULT_WORKLOADS = ("mlp", "large", "gpt2")


def saved_bytes(contender: Contender) -> tuple[int, int]:
    """(all saved bytes, activation bytes) of one forward: each storage counted once."""
    storages: dict[int, tuple[int, bool]] = {}
    keep = {p.untyped_storage().data_ptr() for p in contender.model.parameters()}
    keep.add(contender.inputs.untyped_storage().data_ptr())

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = (storage.nbytes(), storage.data_ptr() not in keep)
        return tensor

    contender.model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = contender.step_fn(contender.inputs)
    (out**2).mean().backward()
    return sum(n for n, _ in storages.values()), sum(n for n, act in storages.values() if act)


def build(factory: Callable[[], Any], file: str) -> tuple[list[Contender], dict[str, dict[str, Any]]]:
    base, example = factory()
    x = example[0]
    builders = [
        ("inductor", lambda m: torch.compile(m)),
        (f"mounted:{file}", lambda m: torch.compile(m, options=passkit.inductor_options(file))),
    ]
    contenders, compile_s, rewrites = [], {}, {}
    for name, make in builders:
        seen = len(passkit.reports())
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        contender = Contender(name, model, make(model), x.clone())
        started = time.perf_counter()
        with cold_kernel_cache():
            contender.step()
        compile_s[name] = time.perf_counter() - started
        # What the mounted steps did: pattern rewrites over every graph (gemm, noops).
        rewrites[name] = sum(r.stats.get("rewrites", 0) for report in passkit.reports()[seen:] for r in report.records)
        for _ in range(WARMUP_STEPS):
            contender.step()
        contenders.append(contender)
    return contenders, {"compile_s": compile_s, "rewrites": rewrites}


def warm_up(file: str) -> None:
    """Pay first-use costs (imports, registries, pattern tracing) outside every figure."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    for options in ({}, passkit.inductor_options(file)):
        torch._dynamo.reset()
        (torch.compile(copy.deepcopy(model), options=options)(torch.randn(4, 8)) ** 2).mean().backward()
    torch._dynamo.reset()


def run_workload(name: str, file: str, rounds: int) -> dict[str, Any]:
    factory, default_rounds = WORKLOADS[name]
    contenders, built = build(factory, file)
    for index in range(rounds or default_rounds):
        order = contenders if index % 2 == 0 else contenders[::-1]
        for contender in order:
            started = time.perf_counter()
            contender.step()
            contender.times_s.append(time.perf_counter() - started)
    rows = {}
    for contender in contenders:
        total, activations = saved_bytes(contender)
        rows[contender.name] = {
            "median_ms": contender.median_s * 1e3,
            "min_ms": contender.min_s * 1e3,
            "compile_s": built["compile_s"][contender.name],
            "rewrites": built["rewrites"][contender.name],
            "saved_bytes": total,
            "activation_bytes": activations,
        }
    return rows


def print_table(workload: str, rows: dict[str, dict[str, Any]]) -> None:
    base = rows["inductor"]
    print(f"\n== {workload} ==")
    header = f"{'contender':<34} {'median':>10} {'min':>10} {'vs inductor':>11} {'compile':>9} {'saved':>10} {'activations':>11} {'rewrites':>8}"
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        print(
            f"{name:<34} {row['median_ms']:7.2f} ms {row['min_ms']:7.2f} ms {row['median_ms'] / base['median_ms']:10.3f}x"
            f" {row['compile_s']:7.2f} s {row['saved_bytes'] / 2**20:6.2f} MiB {row['activation_bytes'] / 2**20:7.2f} MiB {row['rewrites']:8d}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", default=DEFAULT_FILE, help="pipeline name or .toml path to mount")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds (default: step_time.py's per workload)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    passkit.inductor_options(args.file)  # a bad file fails here, in one line
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        disable_compile_caches(scratch)
        warm_up(args.file)
        for workload in args.workloads.split(","):
            results[workload] = run_workload(workload, args.file, args.rounds)
            print_table(workload, results[workload])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
