"""Measure one training step's time and compile time: eager, torch.compile and passkit pipelines.

A step is: zero the grads, forward, ``loss = (out ** 2).mean()``, backward. Contenders:

- ``eager``: the model as is;
- ``aot_eager``: ``torch.compile(backend="aot_eager")`` (torch's AOT Autograd, graphs run eagerly);
- ``inductor``: ``torch.compile(backend="inductor")``, skipped with a note if it cannot compile here;
- ``passkit:<pipeline>``: ``passkit.compile(model, pipeline=...)`` for each pipeline named on the
  command line (a pipeline name or a ``.toml`` path; default ``training`` and ``training-python``).

Method: every contender gets its own deep copy of the model and its own copy of the input. Its
COMPILE time is the wall time of its first step (Dynamo, the backend, forward and backward
compilation), the median of ``--compile-repeats`` fresh compiles after ``torch._dynamo.reset()``
(every contender alike, Inductor included). After two more warm-up steps the contenders are timed round by round: each round
runs every contender once, in an order that rotates each round, and the median per contender is
reported, with the minimum (less sensitive to other processes). First-use costs
(imports, registries) are paid by an untimed warm-up compile, Inductor's and AOT Autograd's
on-disk caches are switched off, passkit's compile cache too (``cache="off"``: a hit would run
none of passkit's stages), and every compile starts from empty Inductor kernel caches, so
compile times are cold and comparable.

With few cores, any other busy process makes torch's worker threads wait on each other and step
times jump several-fold; the machine line prints the load average, and ``--threads 1`` gives
steadier figures on a shared machine.

``--device cuda --dtype bfloat16`` runs the same comparison on a GPU in bf16 (models and
floating inputs cast, every step synchronized before its clock stops; Inductor and passkit's
``training`` emit Triton there). The targets below are set for the CPU: on another device they
are printed as figures and do not set the exit status.

Workloads: ``mlp``; ``small`` (2-layer block, d=64); ``conv_bn`` (a conv/BatchNorm net);
``large`` (2-layer block, d=256, input (8, 128, 256)); ``gpt2`` (Hugging Face GPT-2, random
weights, small size, attention and dropout at their defaults).

Targets (exit status 1 if one fails), for the ``training`` pipeline:
(a) passkit / eager <= inductor / eager (within 3% for noise), on every workload;
(b) passkit / eager <= 1.10 on ``mlp`` and <= 0.90 on ``large``;
(c) passkit compile time <= inductor's, on every workload.
(a) and (b) are judged head to head after the rounds: passkit against Inductor and against eager
in ``--pairs`` ``A B B A`` blocks of adjacent steps (more until three seconds have passed), the
median of those ratios, with the table's ratios printed beside them (``paired.py`` says why).

Run: ``python benchmarks/step_time.py [PIPELINE ...] [--workloads mlp,small,conv_bn,large,gpt2] [--rounds N]
[--compile-repeats 1] [--threads 2] [--pairs 10] [--device cpu] [--dtype float32] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

import passkit
from paired import head_to_head, repetitions
from passkit.examples import transformer

class ConvBN(torch.nn.Module):
    """A small conv/BatchNorm image net: two conv-BN-ReLU stages, pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def conv_bn() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return ConvBN(), (torch.randn(16, 3, 32, 32),)


class GPT2Logits(torch.nn.Module):
    """A Hugging Face GPT-2 LM returning its logits (the step squares them)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


def gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-2 with random weights at a small size; attention, dropout and the rest at defaults."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)
    return GPT2Logits(transformers.GPT2LMHeadModel(config).train()), (torch.randint(0, 1000, (4, 64)),)


WORKLOADS: dict[str, tuple[Callable[[], Any], int]] = {
    # name -> (factory, default rounds)
    "mlp": (transformer.mlp, 15),
    "small": (transformer.small_stack, 15),
    "conv_bn": (conv_bn, 15),
    "large": (transformer.large_stack, 8),
    "gpt2": (gpt2, 10),
}
WARMUP_STEPS = 2
NOISE = 1.03  # "at most Inductor's ratio, within 3% for noise"
HEAD_TO_HEAD_SECONDS = 3.0  # per pair of contenders: a millisecond step needs hundreds of pairs
MLP_RATIO_TARGET = 1.10
LARGE_RATIO_TARGET = 0.90
TARGET_PIPELINE = "training"
DEFAULT_PIPELINES = [TARGET_PIPELINE, "training-python"]


@dataclass
class Contender:
    name: str
    model: torch.nn.Module
    step_fn: Callable[[torch.Tensor], Any]
    inputs: torch.Tensor
    compile_s: float = 0.0
    compile_times_s: list[float] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)

    def step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        out = self.step_fn(self.inputs)
        loss = (out**2).mean()
        loss.backward()
        if self.inputs.is_cuda:
            torch.cuda.synchronize()  # a GPU step ends when its kernels have run, not when launched

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)


@dataclass(frozen=True)
class Placement:
    """Where the contenders run: ``--device`` and ``--dtype``."""

    device: str = "cpu"
    dtype: str = "float32"

    def model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(device=self.device, dtype=getattr(torch, self.dtype))

    def tensor(self, x: torch.Tensor) -> torch.Tensor:
        dtype = getattr(torch, self.dtype) if x.is_floating_point() else x.dtype  # token ids stay integers
        return x.to(device=self.device, dtype=dtype)


@dataclass
class WorkloadResult:
    workload: str
    rounds: int
    compile_repeats: int
    contenders: dict[str, dict[str, Any]]
    notes: list[str]


def machine(placement: Placement) -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "device": torch.cuda.get_device_name() if placement.device == "cuda" else "cpu",
        "dtype": placement.dtype,
    }


def disable_compile_caches(scratch: str) -> None:
    """Cold compiles every run, so compile times do not depend on an earlier run's disk cache."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = scratch  # Inductor's compiled C++ kernels live here


def cold_kernel_cache() -> Any:
    """Inductor's kernel caches (disk and memory) empty for one compile.

    Otherwise a contender that compiles the same C++ kernels as one compiled before it (passkit's
    Inductor codegen and torch.compile's often emit identical kernels) is charged nothing for them.
    """
    from torch._inductor.utils import fresh_cache

    return fresh_cache()


def build_contenders(
    factory: Callable[[], Any], pipelines: list[str], notes: list[str], compile_repeats: int,
    placement: Placement = Placement(),
) -> list[Contender]:
    """Compile every contender ``compile_repeats`` times and keep the last build.

    Each repeat starts from ``torch._dynamo.reset()`` and a fresh deep copy, in a rotated order;
    a contender's compile time is the median of its repeats (Inductor's included: one cold
    compile of a few seconds varies by 10-20% on a shared machine, so a median of one against a
    median of three would not compare like with like).
    """
    base, example = factory()
    base = placement.model(base)
    x = placement.tensor(example[0])
    builders: list[tuple[str, Callable[[torch.nn.Module], Any]]] = [
        ("eager", lambda m: m),
        ("aot_eager", lambda m: torch.compile(m, backend="aot_eager")),
        ("inductor", lambda m: torch.compile(m, backend="inductor")),
    ]
    for spec in pipelines:
        builders.append((f"passkit:{spec}", lambda m, spec=spec: passkit.compile(m, pipeline=spec, cache="off")))
    compile_times: dict[str, list[float]] = {name: [] for name, _ in builders}
    skipped: set[str] = set()
    built: dict[str, Contender] = {}
    for repeat in range(compile_repeats):
        torch._dynamo.reset()
        last = repeat == compile_repeats - 1
        shift = repeat % len(builders)
        for name, build in builders[shift:] + builders[:shift]:
            if name in skipped:
                continue
            model = copy.deepcopy(base)
            contender = Contender(name, model, build(model), x.clone())
            started = time.perf_counter()
            try:
                with cold_kernel_cache():
                    contender.step()
            except Exception as exc:  # noqa: BLE001 - a contender that cannot compile is reported, not fatal
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                notes.append(f"{name} skipped: {type(exc).__name__}: {reason[:160]}")
                skipped.add(name)
                continue
            compile_times[name].append(time.perf_counter() - started)
            if last:
                built[name] = contender
    contenders = [built[name] for name, _ in builders if name in built]
    for contender in contenders:
        contender.compile_s = statistics.median(compile_times[contender.name])
        contender.compile_times_s = compile_times[contender.name]
        for _ in range(WARMUP_STEPS):
            contender.step()
    return contenders


def warm_up(pipelines: list[str], placement: Placement = Placement()) -> None:
    """Pay first-use costs (imports, registries, decomposition tables) outside every figure.

    Otherwise whichever contender compiles first in the process is charged for them.
    """
    model = placement.model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 8)))
    x = placement.tensor(torch.randn(4, 8))
    compilers = [lambda m: torch.compile(m, backend="aot_eager")]
    compilers += [lambda m, spec=spec: passkit.compile(m, pipeline=spec, cache="off") for spec in pipelines]
    for compile_fn in compilers:
        compiled = compile_fn(copy.deepcopy(model))
        (compiled(x) ** 2).mean().backward()
    torch._dynamo.reset()


def time_rounds(contenders: list[Contender], rounds: int) -> None:
    for round_index in range(rounds):
        shift = round_index % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            started = time.perf_counter()
            contender.step()
            contender.times_s.append(time.perf_counter() - started)


def run_workload(name: str, pipelines: list[str], rounds: int, compile_repeats: int, pairs: int = 0,
                 placement: Placement = Placement()) -> WorkloadResult:
    notes: list[str] = []
    factory, _ = WORKLOADS[name]
    contenders = build_contenders(factory, pipelines, notes, compile_repeats, placement)
    time_rounds(contenders, rounds)
    paired = time_head_to_head({c.name: c for c in contenders}, target_contender(pipelines), pairs)
    figures = {
        c.name: {
            "median_ms": c.median_s * 1e3,
            "min_ms": c.min_s * 1e3,
            "compile_s": c.compile_s,
            "compile_times_s": c.compile_times_s,  # every repeat: a median of 3 can hide a wide spread
            "times_ms": [t * 1e3 for t in c.times_s],
        }
        for c in contenders
    }
    for contender_name, ratios in paired.items():
        figures[contender_name].update(ratios)
    return WorkloadResult(name, rounds, compile_repeats, figures, notes)


def time_head_to_head(by_name: dict[str, Contender], subject: str | None, repetitions: int) -> dict[str, dict[str, Any]]:
    """The target contender's step against Inductor's and eager's, adjacent steps paired."""
    if subject not in by_name or repetitions < 1:
        return {}
    ratios = {}
    for other in ("inductor", "eager"):
        if other in by_name:
            ratio = head_to_head(by_name[subject].step, by_name[other].step, repetitions, HEAD_TO_HEAD_SECONDS)
            ratios[f"vs_{other}_paired"] = ratio.median
            ratios[f"vs_{other}_paired_quartiles"] = [ratio.q1, ratio.q3]
    return {subject: ratios}


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_table(result: WorkloadResult) -> None:
    figures = result.contenders
    eager = figures.get("eager", {}).get("median_ms")
    inductor_compile = figures.get("inductor", {}).get("compile_s")
    width = max([len("contender"), *(len(n) for n in figures)])
    print(f"\n== {result.workload} ({result.rounds} rounds; compile: median of {result.compile_repeats}) ==")
    header = f"{'contender'.ljust(width)}  {'median':>10}  {'min':>10}  {'vs eager':>8}  {'compile':>9}  {'vs inductor':>11}"
    print(header)
    print("-" * len(header))
    for name, fig in figures.items():
        compile_s = fig["compile_s"] if name != "eager" else None
        print(
            f"{name.ljust(width)}  {fig['median_ms']:7.2f} ms  {fig['min_ms']:7.2f} ms  {_fmt(_ratio(fig['median_ms'], eager), '.3f', 'x'):>8}"
            f"  {_fmt(compile_s, '7.2f', ' s'):>9}  {_fmt(_ratio(compile_s, inductor_compile), '.2f', 'x'):>11}"
        )
    for name, fig in figures.items():
        for other in ("inductor", "eager"):
            if f"vs_{other}_paired" in fig:
                q1, q3 = fig[f"vs_{other}_paired_quartiles"]
                print(f"head to head, {name} / {other}: x{fig[f'vs_{other}_paired']:.3f} (quartiles {q1:.3f}-{q3:.3f})")
    for note in result.notes:
        print(f"note: {note}")


def target_contender(pipelines: list[str]) -> str | None:
    """The contender the targets judge: the ``training`` pipeline, by name or by a path to it."""
    for spec in pipelines:
        if spec == TARGET_PIPELINE:
            return f"passkit:{spec}"
    for spec in pipelines:
        if passkit.load_pipeline(spec).name == TARGET_PIPELINE:
            return f"passkit:{spec}"
    return None


def evaluate_targets(results: dict[str, WorkloadResult], pipelines: list[str]) -> list[tuple[str, bool | None, str]]:
    """Rows of (target, passed or None when not measured, figures)."""
    subject = target_contender(pipelines)
    if subject is None:
        return [("targets", None, f"no '{TARGET_PIPELINE}' pipeline among the contenders")]
    rows: list[tuple[str, bool | None, str]] = []

    def ratio(workload: str, name: str) -> float | None:
        result = results.get(workload)
        if result is None:
            return None
        return _ratio(result.contenders.get(name, {}).get("median_ms"), result.contenders.get("eager", {}).get("median_ms"))

    def paired(workload: str, other: str) -> float | None:
        result = results.get(workload)
        return None if result is None else result.contenders.get(subject, {}).get(f"vs_{other}_paired")

    for workload in results:
        ours, theirs = ratio(workload, subject), ratio(workload, "inductor")
        head = paired(workload, "inductor")
        if head is not None:
            passed: bool | None = head <= NOISE
            figures = f"x{head:.3f} of inductor's step, paired ({_fmt(ours, '.3f', 'x')} vs {_fmt(theirs, '.3f', 'x')})"
        else:
            passed = None if ours is None or theirs is None else ours <= theirs * NOISE
            figures = f"{_fmt(ours, '.3f', 'x')} vs {_fmt(theirs, '.3f', 'x')}"
        rows.append((f"(a) {workload}: {subject} / eager <= inductor / eager (+3%)", passed, figures))
    for workload, limit in (("mlp", MLP_RATIO_TARGET), ("large", LARGE_RATIO_TARGET)):
        ours, head = ratio(workload, subject), paired(workload, "eager")
        judged = head if head is not None else ours
        figures = _fmt(ours, ".3f", "x") if head is None else f"x{head:.3f} paired (table {_fmt(ours, '.3f', 'x')})"
        rows.append((f"(b) {workload}: {subject} / eager <= {limit}", None if judged is None else judged <= limit, figures))
    for workload, result in results.items():
        ours_c = result.contenders.get(subject, {}).get("compile_s")
        theirs_c = result.contenders.get("inductor", {}).get("compile_s")
        passed = None if ours_c is None or theirs_c is None else ours_c <= theirs_c
        rows.append((f"(c) {workload}: {subject} compile <= inductor's", passed,
                     f"{_fmt(ours_c, '.2f', ' s')} vs {_fmt(theirs_c, '.2f', ' s')}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", default=DEFAULT_PIPELINES, help="passkit pipelines (names or .toml paths)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per workload (default: per workload)")
    parser.add_argument("--compile-repeats", type=int, default=1, help="compiles per contender, Inductor included (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--pairs", type=repetitions, default=10,
                        help="A B B A repetitions for the head-to-head verdicts (two ratios each); 0 judges on the table")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the contenders run")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the models' and floating inputs' dtype")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures to this file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"argument --device: cuda is not available on this machine (torch {torch.__version__})")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    for spec in args.pipelines:
        try:
            passkit.load_pipeline(spec)  # a bad pipeline fails now, in one line, not after minutes
        except passkit.PasskitError as exc:
            parser.error(str(exc))

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="step-time-inductor-") as scratch:
        disable_compile_caches(scratch)
        return run(args, workloads)


def run(args: argparse.Namespace, workloads: list[str]) -> int:
    """Measure every workload, print the tables and the targets; 1 if a target fails."""
    placement = Placement(args.device, args.dtype)
    info = machine(placement)
    print(f"machine: {info['cpu']}; {info['threads']} threads; torch {info['torch']}; python {info['python']}")
    print(f"device: {info['device']}; dtype: {info['dtype']}")
    if info["load_average_1min"] is not None:
        # With few cores, another busy process makes torch's worker threads wait on each other.
        print(f"load average at start: {info['load_average_1min']:.2f} (above ~0.5 the step times are noisy)")

    warm_up(args.pipelines, placement)
    results: dict[str, WorkloadResult] = {}
    for workload in workloads:
        rounds = args.rounds or WORKLOADS[workload][1]
        results[workload] = run_workload(workload, args.pipelines, rounds, args.compile_repeats, args.pairs, placement)
        print_table(results[workload])

    rows = evaluate_targets(results, args.pipelines)
    cpu_targets = placement.device == "cpu"
    print("\ntargets" if cpu_targets else f"\ntargets (set for the CPU: figures on {placement.device}, not verdicts)")
    width = max(len(row[0]) for row in rows)
    failed = False
    for label, passed, figures in rows:
        verdict = "n/a (workload not run)" if passed is None else ("PASS" if passed else "FAIL")
        failed |= passed is False and cpu_targets
        print(f"{label.ljust(width)}  {figures:<28}  {verdict}")

    if args.json:
        payload = {
            "machine": info,
            "pipelines": args.pipelines,
            "workloads": {name: asdict(result) for name, result in results.items()},
            "targets": [{"target": label, "passed": passed, "figures": figs} for label, passed, figs in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
