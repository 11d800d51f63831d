"""Measure what the compile cache saves: a second process compiling a small Hugging Face GPT-2.

Each measurement is a fresh Python process that builds a 2-layer GPT-2 (``transformers``, eager
attention), compiles it with ``passkit.compile`` and runs one training step. Two contenders:

- ``cold``: an empty cache folder, so every step of the pipeline runs (and the entry is written);
- ``warm``: the folder a cold run just filled, so the compiled graphs are loaded.

Per process, two figures: ``compile``, the time passkit spends turning the captured program into
callables (``passkit.api.compile_program``: the pipeline, or the cache lookup and load), and
``first call``, the wall time of the first forward and backward (Dynamo's capture included,
which the cache does not cover). Each round uses a fresh folder and runs cold, then warm (warm
needs what cold wrote); medians over rounds are quoted, and the ratio warm/cold is taken within
the run. Numerics of warm and cold are compared exactly.

Target: warm ``compile`` <= 0.2 x cold ``compile`` (exit status 1 otherwise).

Run: ``python benchmarks/cache.py [--rounds 3] [--pipeline training-python] [--layers 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.2
ROOT = Path(__file__).resolve().parents[1]


def child(pipeline: str, layers: int) -> None:
    import torch
    import transformers

    import passkit
    import passkit.api

    spent: list[float] = []
    original = passkit.api.compile_program

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    passkit.api.compile_program = timed
    config = transformers.GPT2Config(n_layer=layers, n_head=2, n_embd=64, vocab_size=128, n_positions=32,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 128, (2, 16))
    compiled = passkit.compile(model, pipeline=pipeline)
    started = time.perf_counter()
    out = compiled(input_ids=ids, labels=ids)
    out.loss.backward()
    first_call = time.perf_counter() - started
    print(json.dumps({
        "compile": sum(spent),
        "first_call": first_call,
        "hits": [r.cache for r in compiled.passkit_reports],
        "loss": float(out.loss),
        "grad_sum": float(sum(p.grad.double().sum() for p in model.parameters() if p.grad is not None)),
    }))


def run_child(cache: Path, pipeline: str, layers: int) -> dict:
    env = {**os.environ, "PASSKIT_CACHE_DIR": str(cache)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, __file__, "--child", "--pipeline", pipeline, "--layers", str(layers)],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline", default="training-python")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.pipeline, args.layers)
        return 0
    results: dict[str, list[dict]] = {"cold": [], "warm": []}
    for round_index in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            cache = Path(folder)
            order = ["cold", "warm"]
            cold = run_child(cache, args.pipeline, args.layers)
            warm = run_child(cache, args.pipeline, args.layers)
            results["cold"].append(cold)
            results["warm"].append(warm)
            print(f"round {round_index + 1}: " + ", ".join(
                f"{name} compile {r['compile']:.2f} s, first call {r['first_call']:.2f} s, cache {r['hits']}"
                for name, r in zip(order, (cold, warm))), flush=True)
            if (warm["loss"], warm["grad_sum"]) != (cold["loss"], cold["grad_sum"]):
                print(f"NUMERICS DIFFER: cold {cold['loss']} {cold['grad_sum']} vs warm {warm['loss']} {warm['grad_sum']}")
                return 1
    med = {name: {key: statistics.median(r[key] for r in runs) for key in ("compile", "first_call")}
           for name, runs in results.items()}
    print(f"\nGPT-2 ({args.layers} layers), pipeline {args.pipeline}, {args.rounds} rounds, medians:")
    print(f"{'':6}  {'compile':>9}  {'first call':>10}")
    for name in ("cold", "warm"):
        print(f"{name:6}  {med[name]['compile']:8.3f}s  {med[name]['first_call']:9.3f}s")
    ratio = med["warm"]["compile"] / med["cold"]["compile"]
    first = med["warm"]["first_call"] / med["cold"]["first_call"]
    print(f"warm/cold: compile {ratio:.3f}x (target <= {TARGET}x), first call {first:.3f}x")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
