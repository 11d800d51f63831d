"""Measure what each built-in pattern set buys: training step time and saved bytes, with and without.

Contenders are pipelines: ``training-python`` as is, and ``training-python`` with one
``rewrite`` step (after ``decompose``, pre-grad) applying one set, or all of them. Workloads:

- ``block256``: the d=256, 2-layer transformer stack of ``passkit/examples/transformer.py``
  (``large_stack``: input 8 x 128 x 256);
- ``gpt2``: Hugging Face GPT-2 at its default config (12 layers, d=768) with
  ``attn_implementation="eager"``, input ids 2 x 128, ``eval()`` so dropout draws nothing.

Method: each contender compiles its own deep copy of the model (compile time is its first
step), takes two warm-up steps, then all contenders are timed round by round in an order that
rotates each round; the median and minimum step times are reported, with the ratio to the
baseline's median from the same run. ``saved`` is the partition step's ``saved_bytes``: what the
forward keeps for the backward. ``applied`` is the rewrite step's count.

Run: ``python benchmarks/patterns.py [--workloads block256,gpt2] [--rounds N] [--threads 2]
[--sets attention,noops,constant_fold] [--json OUT]``.
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
from pathlib import Path
from typing import Any, Callable

import torch

import passkit
from passkit.examples import transformer

BASELINE = "training-python"


def _gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config()
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids).logits

    return Logits(), (torch.randint(0, config.vocab_size, (2, 128)),)


WORKLOADS: dict[str, tuple[Callable[[], Any], int]] = {
    "block256": (transformer.large_stack, 10),
    "gpt2": (_gpt2, 5),
}


def _pipeline(folder: Path, sets: list[str]) -> str:
    if not sets:
        return BASELINE
    name = "-".join(sets)
    path = folder / f"{name}.toml"
    patterns = ", ".join(f'"{s}"' for s in sets)
    path.write_text(
        f'[pipeline]\nname = "{name}"\nextends = "{BASELINE}"\n\n'
        f'[[steps]]\npass = "rewrite"\npatterns = [{patterns}]\nafter = "decompose"\n'
    )
    return str(path)


def _stat(compiled: Any, pass_name: str, key: str) -> Any:
    for report in compiled.passkit_reports:
        for record in report.records:
            if record.pass_name.startswith(pass_name) and key in record.stats:
                return record.stats[key]
    return None


class Contender:
    def __init__(self, label: str, pipeline: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self.label = label
        self.model = copy.deepcopy(model)
        self.inputs = inputs
        started = time.perf_counter()
        self.compiled = passkit.aot_module(self.model, pipeline=pipeline)
        self.step()
        self.compile_s = time.perf_counter() - started
        self.times: list[float] = []

    def step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        out = self.compiled(*self.inputs)
        out.float().square().mean().backward()

    def timed_step(self) -> None:
        started = time.perf_counter()
        self.step()
        self.times.append(time.perf_counter() - started)


def run(workload: str, sets: list[str], rounds: int | None, folder: Path) -> list[dict[str, Any]]:
    factory, default_rounds = WORKLOADS[workload]
    model, inputs = factory()
    variants = [("baseline", [])] + [(s, [s]) for s in sets] + ([("all", sets)] if len(sets) > 1 else [])
    contenders = []
    for label, chosen in variants:
        print(f"  compiling {workload}/{label} ...", file=sys.stderr, flush=True)
        contenders.append(Contender(label, _pipeline(folder, chosen), model, inputs))
    for contender in contenders:
        for _ in range(2):
            contender.step()
    total = rounds or default_rounds
    for index in range(total):
        shift = index % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            contender.timed_step()
        print(f"  round {index + 1}/{total}", file=sys.stderr, flush=True)
    base = statistics.median(contenders[0].times)
    rows = []
    for contender in contenders:
        median = statistics.median(contender.times)
        rows.append(
            {
                "workload": workload,
                "variant": contender.label,
                "median_ms": median * 1000,
                "min_ms": min(contender.times) * 1000,
                "ratio": median / base,
                "saved_bytes": _stat(contender.compiled, "partition", "saved_bytes"),
                "applied": _stat(contender.compiled, "rewrite", "rewrites"),
                "compile_s": contender.compile_s,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="block256,gpt2")
    parser.add_argument("--sets", default="attention,noops,constant_fold")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for workload in args.workloads.split(","):
            rows += run(workload, args.sets.split(","), args.rounds, Path(folder))
    header = f"{'workload':<9} {'variant':<14} {'median ms':>10} {'min ms':>9} {'ratio':>6} {'saved MiB':>10} {'applied':>8} {'compile s':>9}"
    print(header)
    for r in rows:
        saved = "-" if r["saved_bytes"] is None else f"{r['saved_bytes'] / 2**20:.2f}"
        print(
            f"{r['workload']:<9} {r['variant']:<14} {r['median_ms']:>10.1f} {r['min_ms']:>9.1f} "
            f"{r['ratio']:>6.3f} {saved:>10} {r['applied'] if r['applied'] is not None else '-':>8} {r['compile_s']:>9.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
