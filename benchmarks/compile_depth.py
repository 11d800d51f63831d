"""Cold compile time against model depth: eager, Inductor, and ``training`` with and without regions.

Workloads: the acceptance block stack (``passkit.examples.transformer``, d=64, input (4, 32, 64))
at 2, 8, 24 and 48 layers (``stack2`` ...), and Hugging Face GPT-2 and Llama with 12 layers at
their default settings otherwise (attention implementation, dropout, activations), at a small
hidden size (GPT-2: 128, 4 heads; Llama: 128, 4 heads, MLP 344), vocabulary 1000, input (4, 64).

Contenders: ``eager``; ``inductor`` (``torch.compile``); ``training`` (passkit's default
pipeline, whose ``regions`` step outlines repeated layers, docs/regions.md); ``training-no-regions``
(the same with that step disabled).

Method: every compile runs in a fresh subprocess with ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``,
a fresh ``TORCHINDUCTOR_CACHE_DIR`` and a fresh ``PASSKIT_CACHE_DIR``; the subprocess first pays
first-use costs (imports, registries) by compiling a tiny MLP with the same contender, then
times the first training step of the workload (Dynamo, the backend, forward and backward
compilation): that is the COMPILE figure. It then takes ``--steps`` more steps and reports their
median (the STEP figure; each contender in its own process, so it carries the host's drift:
``--paired`` judges step time head to head instead). Contenders run interleaved, in an order
that rotates each round; medians over ``--rounds`` are printed, and ratios to Inductor.

``--stages`` adds, for the passkit contenders, where the cold compile went (medians over rounds):
Dynamo's trace up to passkit's backend, capture (the backend before its first step), each
pipeline step, and ``after`` (from the end of the pipeline to the end of the first step: Dynamo's
guards, the first forward and backward, and the wait for kernels still compiling); ``gc`` is the
part of the whole first step that Python's garbage collector took, spread over the others.

``--paired WORKLOAD`` instead compiles ``training`` and ``training-no-regions`` in one process and
times their steps head to head (``paired.py``: ``A B B A`` blocks, median of the ratios).
``--block-steps N`` times each side N consecutive steps at a time, as a training loop runs them.
``--layers-per-region N`` sets the ``regions`` step's ``layers_per_region`` in both modes.
``--no-trace-once`` turns off its ``trace_once`` (Dynamo traces each repeated layer once, docs/regions.md).
``--device cuda`` puts the models and inputs on the GPU and waits for its work before each clock
reading (``--threads`` still sets the CPU threads).

Run: ``python benchmarks/compile_depth.py [--workloads stack2,stack8,stack24,stack48,gpt2,llama]
[--contenders eager,inductor,training,training-no-regions] [--rounds 1] [--steps 5] [--threads 2]
[--stages] [--device cpu] [--json OUT]`` or ``python benchmarks/compile_depth.py --paired stack24 [--pairs 20]``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

def regions_overlay(base: str, layers_per_region: int = 1, trace_once: bool | None = None,
                    min_repeats: int | None = None) -> str:
    """A pipeline file: ``base`` with the ``regions`` step on, named ``<base>-regions``; an option
    given here is set, the others keep the base's values (or the step's defaults, added here)."""
    import passkit

    options = f"layers_per_region = {layers_per_region}\n" if layers_per_region > 1 else ""
    options += "" if min_repeats is None else f"min_repeats = {min_repeats}\n"
    options += "" if trace_once is None else f"trace_once = {str(trace_once).lower()}\n"
    head = f'[pipeline]\nname = "{base}-regions"\nextends = "{base}"\n\n'
    if any(step.id == "regions" for step in passkit.load_pipeline(base).steps):
        return head + f"[override.regions]\nenabled = true\n{options}"
    return head + f'[[steps]]\npass = "regions"\nbefore = "functionalize"\n{options}'


def no_regions_overlay(base: str) -> str:
    """A pipeline file: ``base`` without its ``regions`` step, named ``<base>-no-regions``."""
    return f'[pipeline]\nname = "{base}-no-regions"\nextends = "{base}"\ndisable = ["regions"]\n'


CONTENDERS = ["eager", "inductor", "training", "training-no-regions"]
WORKLOADS = ["stack2", "stack8", "stack24", "stack48", "gpt2", "llama"]


DEVICE = "cpu"  # --device: where models, inputs and steps run


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    model, inputs = _built(name)
    return model.to(DEVICE), tuple(t.to(DEVICE) for t in inputs)


def _built(name: str) -> tuple[Any, tuple[Any, ...]]:
    import torch

    torch.manual_seed(0)
    if name.startswith("stack"):
        from passkit.examples import transformer

        return transformer.TransformerStack(int(name[len("stack"):]), 64, 4), (torch.randn(4, 32, 64),)
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=12, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)
        model = transformers.GPT2LMHeadModel(config)
    elif name == "llama":
        config = transformers.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=12,
                                          num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
        model = transformers.LlamaForCausalLM(config)
    else:
        raise SystemExit(f"compile_depth.py: unknown workload {name!r} (one of {', '.join(WORKLOADS)})")

    class LM(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner.train()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids).logits

    return LM(model), (torch.randint(0, 1000, (4, 64)),)


def compiler(contender: str, pipelines: str, progress: Any = None) -> Callable[[Any], Any]:
    """How ``contender`` compiles a model; passkit's contenders read their files in ``pipelines``."""
    import torch

    import passkit

    if contender == "eager":
        return lambda m: m
    if contender == "inductor":
        return lambda m: torch.compile(m, backend="inductor")
    pipeline = str(Path(pipelines) / f"{contender}.toml")
    return lambda m: passkit.compile(m, pipeline=pipeline, cache="off", progress=progress)


def write_pipelines(folder: str, layers_per_region: int = 1, trace_once: bool | None = None,
                    min_repeats: int | None = None) -> None:
    """The passkit contenders' files: ``training`` with the regions options asked for, and
    ``training-no-regions``."""
    Path(folder, "training.toml").write_text(regions_overlay("training", layers_per_region, trace_once, min_repeats))
    Path(folder, "training-no-regions.toml").write_text(no_regions_overlay("training"))


class StageClock:
    """A passkit progress callback that notes when the backend starts and finishes, and the
    garbage collector's share of the time while it is armed."""

    def __init__(self) -> None:
        self.entered: float | None = None
        self.finished_at: float | None = None
        self.gc_seconds = 0.0
        self._gc_started = 0.0

    def __call__(self, record: Any) -> None:
        pass  # the records come with the report; no log lines in the figure

    def event(self, event: Any) -> None:
        if event.kind in ("compiling", "recompiling") and self.entered is None:
            self.entered = time.perf_counter()

    def finished(self, report: Any) -> None:
        self.finished_at = time.perf_counter()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_started

    def __enter__(self) -> StageClock:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._on_gc)

    def stages(self, started: float, ended: float, report: Any) -> dict[str, float]:
        """Seconds per stage of the first step that started at ``started`` and ended at ``ended``."""
        if self.entered is None or self.finished_at is None:
            return {}
        ran = [r for r in report.records if r.status == "ran"]
        stages = {"dynamo": self.entered - started,
                  "capture": max(0.0, self.finished_at - self.entered - report.seconds)}
        stages.update({r.id: r.seconds for r in ran})
        stages["after"] = ended - self.finished_at
        stages["gc"] = self.gc_seconds
        return stages


def train_step(model: Any, inputs: tuple[Any, ...]) -> None:
    import torch

    for p in model.parameters():
        p.grad = None
    out = model(*inputs)
    (out * torch.linspace(0.5, 1.5, out.numel(), device=out.device).reshape(out.shape)).sum().backward()
    if out.device.type == "cuda":
        torch.cuda.synchronize()  # a step ends when the GPU has done its work


def child(workload: str, contender: str, steps: int, threads: int, pipelines: str) -> dict[str, Any]:
    """One cold compile and ``steps`` timed steps, in this (fresh) process."""
    import torch

    torch.set_num_threads(threads)
    compile_fn = compiler(contender, pipelines)
    tiny = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    train_step(compile_fn(tiny.to(DEVICE)), (torch.randn(4, 8, device=DEVICE),))  # first-use costs, outside the figure
    torch._dynamo.reset()
    model, inputs = build(workload)
    clock = StageClock()
    compiled = compiler(contender, pipelines, progress=clock)(model)
    with clock:
        started = time.perf_counter()
        train_step(compiled, inputs)
        ended = time.perf_counter()
    compile_s = ended - started
    first_step = (started, ended)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        train_step(compiled, inputs)
        times.append(time.perf_counter() - started)
    result: dict[str, Any] = {"compile_s": compile_s, "step_s": statistics.median(times) if times else None}
    reports = getattr(compiled, "passkit_reports", None)
    if reports:
        record = next((r for r in reports[0].records if r.id == "regions"), None)
        shown = ("repeats", "joined_marked", "traced_once")
        result["regions"] = ({k: v for k, v in record.stats.items() if k in shown} or None
                             if record is not None and record.status == "ran" else None)
        result["stages"] = clock.stages(*first_step, reports[0])
        codegen = next((r for r in reports[0].records if r.id.startswith("codegen") and r.status == "ran"), None)
        result["codegen"] = {k: v for k, v in codegen.stats.items() if isinstance(v, (int, float, str))} if codegen else {}
    return result


def run_child(workload: str, contender: str, steps: int, threads: int, pipelines: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "PASSKIT_CACHE_DIR": f"{scratch}/passkit",
               "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/inductor", "PYTHONWARNINGS": "ignore"}
        command = [sys.executable, __file__, "--child", workload, contender, "--steps", str(steps),
                   "--threads", str(threads), "--pipelines", pipelines, "--device", DEVICE]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:200]}
    return json.loads(lines[-1])


def paired(workload: str, pairs: int, threads: int, pipelines: str, block: int = 1) -> None:
    """Steps of ``training`` against ``training-no-regions``, head to head, each side ``block``
    consecutive steps at a time (1: single steps, each starting on the other program's caches)."""
    import torch

    from paired import head_to_head

    torch.set_num_threads(threads)
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    model, inputs = build(workload)
    regions = compiler("training", pipelines)(copy.deepcopy(model))
    flat = compiler("training-no-regions", pipelines)(copy.deepcopy(model))
    for compiled in (regions, flat, regions, flat):
        train_step(compiled, inputs)
    def steps(compiled: Any) -> Callable[[], None]:
        return lambda: [train_step(compiled, inputs) for _ in range(block)]

    ratio = head_to_head(steps(regions), steps(flat), pairs, min_seconds=3.0)
    blocks = "" if block == 1 else f", blocks of {block} steps"
    print(f"{workload}: step of training / training-no-regions, head to head{blocks}: {ratio} ({ratio.pairs} pairs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--paired", metavar="WORKLOAD")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--stages", action="store_true", help="also print where each passkit compile went")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the models run (default cpu)")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help=argparse.SUPPRESS)
    parser.add_argument("--pipelines", help=argparse.SUPPRESS)
    parser.add_argument("--block-steps", type=int, default=1,
                        help="with --paired: time each side this many consecutive steps at a time (default 1)")
    parser.add_argument("--layers-per-region", type=int, default=1,
                        help="the regions step's layers_per_region for training (default 1)")
    parser.add_argument("--no-trace-once", action="store_true",
                        help="turn off the regions step's trace_once for training (Dynamo then traces every layer)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(f"argument --device: cuda is not available on this machine (torch {torch.__version__})")
    if args.child:
        print(json.dumps(child(*args.child, args.steps, args.threads, args.pipelines)))
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    contenders = [c for c in args.contenders.split(",") if c]
    for name in [*workloads, *contenders]:
        if name not in WORKLOADS + CONTENDERS:
            print(f"compile_depth.py: unknown workload or contender {name!r}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as scratch:
        write_pipelines(scratch, args.layers_per_region, False if args.no_trace_once else None)
        if args.paired:
            paired(args.paired, args.pairs, args.threads, scratch, args.block_steps)
            return 0
        results: dict[str, dict[str, list[dict[str, Any]]]] = {w: {c: [] for c in contenders} for w in workloads}
        for round_index in range(args.rounds):
            for workload in workloads:
                shift = round_index % len(contenders)
                for contender in contenders[shift:] + contenders[:shift]:
                    result = run_child(workload, contender, args.steps, args.threads, scratch)
                    results[workload][contender].append(result)
                    print(f"  round {round_index + 1} {workload} {contender}: {result}", file=sys.stderr, flush=True)
    print_table(results, contenders)
    print_depth_ratios(results, contenders)
    if args.stages:
        print_stages(results, contenders)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def print_table(results: dict[str, dict[str, list[dict[str, Any]]]], contenders: list[str]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"cold compile (first step) and step time on {DEVICE}, medians; load average {load:.2f}")
    header = f"{'workload':<9}" + "".join(f"  {c + ' compile':>24}  {c + ' step':>20}" for c in contenders)
    print(header)
    for workload, by_contender in results.items():
        base = _median(by_contender.get("inductor", []), "compile_s")
        cells = []
        for contender in contenders:
            runs = by_contender[contender]
            compile_s, step_s = _median(runs, "compile_s"), _median(runs, "step_s")
            ratio = f" (x{compile_s / base:.2f})" if compile_s and base else ""
            cells.append(f"  {(f'{compile_s:.1f} s' if compile_s else 'failed') + ratio:>24}  "
                         f"{(f'{step_s * 1000:.1f} ms' if step_s else '-'):>20}")
        print(f"{workload:<9}" + "".join(cells))
        found = next((run.get("regions") for run in by_contender.get("training", []) if run.get("regions")), None)
        if found:
            print(f"{'':<9}  regions: {found}")


def print_depth_ratios(results: dict[str, dict[str, list[dict[str, Any]]]], contenders: list[str]) -> None:
    """Each contender's compile at one depth over its compile at a shallower one, round by round
    (the depths of a round run one after another, so they share the host's state) and the median."""
    pairs = [(deep, shallow) for deep, shallow in (("stack24", "stack2"), ("stack48", "stack24"))
             if deep in results and shallow in results]
    for contender in contenders:
        for deep, shallow in pairs:
            ratios = [d["compile_s"] / s["compile_s"] for d, s in zip(results[deep][contender], results[shallow][contender])
                      if d.get("compile_s") and s.get("compile_s")]
            if ratios:
                rounds = ", ".join(f"{r:.2f}" for r in ratios)
                print(f"{contender}: {deep} / {shallow} compile: median {statistics.median(ratios):.2f} (rounds: {rounds})")


def print_stages(results: dict[str, dict[str, list[dict[str, Any]]]], contenders: list[str]) -> None:
    """One row per stage, one column per (workload, passkit contender): median seconds."""
    columns = [(w, c) for w in results for c in contenders if any(run.get("stages") for run in results[w][c])]
    if not columns:
        return
    names: list[str] = []
    for workload, contender in columns:
        for run in results[workload][contender]:
            names.extend(name for name in run.get("stages", {}) if name not in names)
    names = [n for n in names if n not in ("after", "gc")] + ["after", "gc"]
    print("\nwhere the first step went, seconds (medians; gc is spread over the other rows)")
    print(f"{'stage':<24}" + "".join(f"  {w + ' ' + c:>26}" for w, c in columns))
    for name in [*names, "total"]:
        cells = []
        for workload, contender in columns:
            runs = results[workload][contender]
            if name == "total":
                value = _median(runs, "compile_s")
            else:
                value = _median([run.get("stages", {}) for run in runs], name)
            cells.append(f"  {f'{value:.2f}' if value is not None else '-':>26}")
        print(f"{name:<24}" + "".join(cells))


if __name__ == "__main__":
    raise SystemExit(main())
