"""Measure what the compile cache saves: a second process compiling a Hugging Face GPT-2.

Each measurement is a fresh Python process that builds a GPT-2 (``transformers``, its own
attention implementation), compiles it with ``passkit.compile`` and runs one training step.
``--model default`` is ``GPT2Config()`` as shipped (12 layers, d=768); ``--model small`` is a
2-layer d=64 GPT-2 for a quick run; ``--model stack24`` (any ``stackN``) is the acceptance block
stack of ``benchmarks/compile_depth.py`` (``passkit.examples.transformer``, N layers, d=64, input
(4, 32, 64)). ``--regions`` adds the ``regions`` step to the pipeline (an overlay, before
``functionalize``), so that the repeated layers are outlined into one shared body, which the
entry then stores with the graphs. Two contenders:

- ``cold``: an empty passkit cache folder, so every step of the pipeline runs (and the entry is
  written);
- ``warm``: the folder a cold run just filled, so no step runs. With ``training`` (ending in
  ``codegen.inductor``) the warm process runs Inductor's inner compile on the stored graphs,
  which finds the code the cold process generated in Inductor's own FX graph cache.

Both share one Inductor cache folder per round (``TORCHINDUCTOR_CACHE_DIR``), empty before the
cold run, so the cold figure includes generating and building every kernel.

Per process: ``compile``, the time passkit spends turning the captured program into callables
(``passkit.frontends.api.compile_program``: the pipeline, or the cache lookup and load); ``capture``,
passkit's functional trace of Dynamo's graph (it runs warm too: the key is computed from it);
``first call``, the wall time of the first forward and backward; ``dynamo``, what the first call
spends outside passkit's backend (Dynamo's tracing and guards) less the time of a second,
compiled step; ``step``, that second step; ``process``, the whole process from start to exit. Each round uses fresh folders and runs cold, then
warm (warm needs what cold wrote); medians over rounds are quoted, and ratios warm/cold are
taken within the run. Numerics of warm and cold are compared exactly, so every process runs with
``torch.use_deterministic_algorithms(True)``: without it Inductor's embedding backward (GPT-2's
``wte``) adds from several threads, and its last bits change from process to process.

Target: warm ``compile`` <= 0.2 x cold ``compile`` (exit status 1 otherwise).

``--loop mistral`` measures a warm restart instead: a Mistral-style training loop
(``transformers.MistralConfig`` at its defaults but for small sizes: 2 layers, d=64, 4 heads, 2
KV heads, vocabulary 256; sequence 16) whose batch size changes 2 -> 3 -> 4, so that the second
size recompiles with a symbolic batch and the third reuses it, plus three more steps at
batch 4. Contenders, each a fresh process: ``passkit`` (``passkit.compile`` with ``--pipeline``)
and ``inductor`` (``torch.compile``, its FX graph cache and AOT autograd cache on), each with
its own cache folders. Per round: each contender runs cold (empty folders), then warm (the
folders its cold run filled); the contenders' order alternates round by round. Figures per
process: ``loop``, the wall time of the six training steps (compiles or cache loads included),
and ``process``, the whole process from start to exit. Medians are quoted, with passkit/inductor
ratios. Target: passkit's warm ``loop`` <= Inductor's (exit status 1 otherwise). Warm losses
must equal cold ones exactly, per contender. Figures: docs/cache.md.

Run: ``python benchmarks/cache.py [--rounds 3] [--pipeline training] [--model default|small|stack24] [--regions]``
or ``python benchmarks/cache.py --loop mistral [--rounds 3] [--pipeline training]``.
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

from compile_depth import regions_overlay  # this folder is on sys.path when a benchmark runs

TARGET = 0.2
ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("compile", "capture", "first_call", "dynamo", "step", "process")
def _timed(module: object, name: str, spent: list[float]) -> None:
    original = getattr(module, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    setattr(module, name, timed)


class _Lines:
    """Collects the passkit.cache.store logger's lines (why something was not stored or not loaded)."""

    def __init__(self) -> None:
        import logging

        self.lines: list[str] = []
        handler = logging.Handler(logging.INFO)
        handler.emit = lambda record: self.lines.append(record.getMessage())
        logger = logging.getLogger("passkit.cache.store")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def child(pipeline: str, model_name: str) -> None:
    cache_lines = _Lines()
    import torch

    import passkit
    import passkit.frontends.api
    from passkit import _torch
    from passkit.core.pass_api import Pass

    compile_spent: list[float] = []
    capture_spent: list[float] = []
    _timed(passkit.frontends.api, "compile_program", compile_spent)
    _timed(passkit.frontends.api, "program_from_graph", capture_spent)
    steps: list[str] = []
    run_pass = Pass.run
    Pass.run = lambda self, *a, **k: steps.append(self.name) or run_pass(self, *a, **k)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    if model_name.startswith("stack"):
        from passkit.examples import transformer

        model = transformer.TransformerStack(int(model_name[len("stack"):]), 64, 4).train()
        x = torch.randn(4, 32, 64)

        def loss_of(call: object) -> torch.Tensor:
            return call(x).square().mean()
    else:
        import transformers

        if model_name == "default":
            config = transformers.GPT2Config()
            ids_shape, vocab = (2, 32), config.vocab_size
        else:
            config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32)
            ids_shape, vocab = (2, 16), 128
        model = transformers.GPT2LMHeadModel(config).train()
        ids = torch.randint(0, vocab, ids_shape)

        def loss_of(call: object) -> torch.Tensor:
            return call(input_ids=ids, labels=ids).loss
    compiled = passkit.compile(model, pipeline=pipeline)
    started = time.perf_counter()
    loss_value = loss_of(compiled)
    loss_value.backward()
    first_call = time.perf_counter() - started
    loss, grad_sum = float(loss_value.detach()), float(sum(p.grad.double().sum() for p in model.parameters() if p.grad is not None))
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    loss_of(compiled).backward()
    step = time.perf_counter() - started
    backend = sum(compile_spent) + sum(capture_spent)
    print(json.dumps({
        "compile": sum(compile_spent),
        "capture": sum(capture_spent),
        "first_call": first_call,
        "dynamo": first_call - backend - step,
        "step": step,
        "hits": [r.cache for r in compiled.passkit_reports],
        "steps_run": len(steps),
        "inductor": _torch.inductor_cache_counts(),
        "regions": [r.stats.get("repeats") for report in compiled.passkit_reports for r in report.records
                    if r.id == "regions"],
        "cache_log": cache_lines.lines,
        "loss": loss,
        "grad_sum": grad_sum,
    }))


MISTRAL_BATCHES = (2, 3, 4, 4, 4, 4)
MISTRAL_FIGURES = ("loop", "process")


def mistral_child(contender: str, pipeline: str) -> None:
    """One process of the Mistral loop: build, compile, train six steps; print one JSON line."""
    cache_lines = _Lines()
    import torch
    import transformers

    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                        max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    if contender == "passkit":
        import passkit

        compiled = passkit.compile(model, pipeline=pipeline)
    else:
        compiled = torch.compile(model)
    losses = []
    started = time.perf_counter()
    for step, batch in enumerate(MISTRAL_BATCHES):
        ids = torch.randint(0, config.vocab_size, (batch, 16), generator=torch.Generator().manual_seed(step))
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    loop = time.perf_counter() - started
    from torch._dynamo.utils import counters  # not passkit's helper: the inductor process never imports passkit

    reports = getattr(compiled, "passkit_reports", [])
    print(json.dumps({
        "loop": loop,
        "hits": [r.cache for r in reports],
        "load_ms": [round(r.load_seconds * 1000, 1) for r in reports],
        "inductor": {kind: int(counters["inductor"].get(f"fxgraph_cache_{kind}", 0)) for kind in ("hit", "miss", "bypass")},
        "cache_log": cache_lines.lines,
        "losses": losses,
    }))


def run_mistral_child(folder: Path, contender: str, pipeline: str) -> dict:
    env = {**os.environ, "PASSKIT_CACHE_DIR": str(folder / "passkit"), "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", "--loop", "mistral", "--contender", contender,
                           "--pipeline", pipeline], env=env, capture_output=True, text=True, timeout=3600)
    process = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process": process}


def mistral_main(rounds: int, pipeline: str) -> int:
    contenders = ["passkit", "inductor"]
    results: dict[tuple[str, str], list[dict]] = {(c, k): [] for c in contenders for k in ("cold", "warm")}
    for round_index in range(rounds):
        order = contenders if round_index % 2 == 0 else contenders[::-1]
        with tempfile.TemporaryDirectory() as folder:
            for kind in ("cold", "warm"):
                for contender in order:
                    r = run_mistral_child(Path(folder) / contender, contender, pipeline)
                    results[(contender, kind)].append(r)
                    extra = f", passkit cache {r['hits']} (load ms {r['load_ms']})" if contender == "passkit" else ""
                    print(f"round {round_index + 1} {contender:8} {kind}: loop {r['loop']:.2f} s, process {r['process']:.2f} s"
                          f"{extra}, Inductor FX cache {r['inductor']}"
                          + "".join(f"\n  passkit.cache.store: {line}" for line in r["cache_log"]), flush=True)
        for contender in contenders:
            cold, warm = results[(contender, "cold")][-1], results[(contender, "warm")][-1]
            if cold["losses"] != warm["losses"]:
                print(f"NUMERICS DIFFER ({contender}): cold {cold['losses']} vs warm {warm['losses']}")
                return 1
    med = {key: {f: statistics.median(r[f] for r in runs) for f in MISTRAL_FIGURES} for key, runs in results.items()}
    print(f"\nMistral-style loop (batches {'-'.join(map(str, MISTRAL_BATCHES))}), passkit pipeline {pipeline}, "
          f"{rounds} rounds, medians (s):")
    print(f"{'':18}" + "".join(f"  {f:>8}" for f in MISTRAL_FIGURES))
    for (contender, kind), figures in med.items():
        print(f"{contender + ' ' + kind:18}" + "".join(f"  {figures[f]:8.2f}" for f in MISTRAL_FIGURES))
    ratio = {f: med[("passkit", "warm")][f] / med[("inductor", "warm")][f] for f in MISTRAL_FIGURES}
    print(f"warm restart, passkit/inductor: loop {ratio['loop']:.2f}x, process {ratio['process']:.2f}x (target loop <= 1.0x)")
    return 0 if ratio["loop"] <= 1.0 else 1


def run_child(cache: Path, inductor_cache: Path, pipeline: str, model: str) -> dict:
    env = {**os.environ, "PASSKIT_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", "--pipeline", pipeline, "--model", model],
                          env=env, capture_output=True, text=True, timeout=3600)
    process = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process": process}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pipeline", default="training")
    parser.add_argument("--model", default="default", help="default, small (GPT-2) or stackN (block stack, N layers)")
    parser.add_argument("--regions", action="store_true", help="add the regions step to the pipeline (before functionalize)")
    parser.add_argument("--loop", choices=["mistral"], default=None,
                        help="time a warm restart of a Mistral-style loop against torch.compile's")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=["passkit", "inductor"], default="passkit", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop == "mistral":
        if args.child:
            mistral_child(args.contender, args.pipeline)
            return 0
        return mistral_main(args.rounds, args.pipeline)
    if args.child:
        child(args.pipeline, args.model)
        return 0
    if args.model not in ("default", "small") and not (args.model.startswith("stack") and args.model[5:].isdigit()):
        parser.error(f"argument --model: {args.model!r} is not default, small or stackN")
    results: dict[str, list[dict]] = {"cold": [], "warm": []}
    for round_index in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder:
            cache, inductor_cache = Path(folder) / "passkit", Path(folder) / "inductor"
            pipeline = args.pipeline
            if args.regions:
                pipeline = str(Path(folder) / f"{args.pipeline}-regions.toml")
                Path(pipeline).write_text(regions_overlay(args.pipeline))
            cold = run_child(cache, inductor_cache, pipeline, args.model)
            warm = run_child(cache, inductor_cache, pipeline, args.model)
        results["cold"].append(cold)
        results["warm"].append(warm)
        for name, r in (("cold", cold), ("warm", warm)):
            print(f"round {round_index + 1} {name}: " + ", ".join(f"{key} {r[key]:.2f} s" for key in FIGURES)
                  + f", cache {r['hits']}, passkit steps run {r['steps_run']}, Inductor FX cache {r['inductor']}"
                  + (f", regions {r['regions']}" if args.regions else "")
                  + "".join(f"\n  passkit.cache.store: {line}" for line in r["cache_log"]), flush=True)
        if (warm["loss"], warm["grad_sum"]) != (cold["loss"], cold["grad_sum"]):
            print(f"NUMERICS DIFFER: cold {cold['loss']} {cold['grad_sum']} vs warm {warm['loss']} {warm['grad_sum']}")
            return 1
    med = {name: {key: statistics.median(r[key] for r in runs) for key in FIGURES} for name, runs in results.items()}
    model = f"block stack ({args.model[5:]} layers, d=64)" if args.model.startswith("stack") else f"GPT-2 ({args.model} config)"
    print(f"\n{model}, pipeline {args.pipeline}{' + regions' if args.regions else ''}, {args.rounds} rounds, medians (s):")
    print(f"{'':6}" + "".join(f"  {key:>10}" for key in FIGURES))
    for name in ("cold", "warm"):
        print(f"{name:6}" + "".join(f"  {med[name][key]:10.3f}" for key in FIGURES))
    ratio = {key: med["warm"][key] / med["cold"][key] if med["cold"][key] > 0 else float("nan") for key in FIGURES}
    print(f"{'warm/cold':9}" + "".join(f"  {ratio[key]:10.3f}" for key in FIGURES)[3:])
    print(f"warm/cold compile {ratio['compile']:.3f}x (target <= {TARGET}x), first call {ratio['first_call']:.3f}x")
    return 0 if ratio["compile"] <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
