"""Measure the memory/time frontier: torch's min-cut against passkit's ``partition.min_cut``.

For each workload and each memory budget (0, 0.25, 0.5, 0.75, 1.0) three partitioners compile
the model through ``training-python`` with its ``partition.default`` step replaced (or, with
``--pipeline training``, through the shipped default with its ``partition.min_cut`` step replaced:
Inductor's fused kernels, and passkit's contenders with ``fused_pointwise = true`` as there):

- ``torch``: ``partition.torch_min_cut`` (torch's min-cut rematerialization partitioner);
- ``flops``: ``partition.min_cut`` with ``estimator = "flops"``;
- ``profile``: ``partition.min_cut`` with ``estimator = "profile"``.

More contenders run ``partition.min_cut`` (flops) under ``max_saved``: limits a quarter and half
of the way between the bytes ``flops`` saved at budgets 0 and 1, and, for each torch point between
the ends, exactly the bytes torch's plan saved (``flops<=torch@b``): the frontier compared point
by point, at equal memory.

Per contender it prints:

- saved bytes, measured from outside: the model's forward runs under
  ``torch.autograd.graph.saved_tensors_hooks`` and every storage packed is counted once
  (parameters the backward reads included, as eager's own figure includes them; the loss,
  computed outside the model and the same for everyone, is not counted);
- step time against eager: contenders are timed round by round, each round in a rotated order,
  and the median per contender is divided by eager's median in the same run;
- whether gradients (and the loss) equal eager's, from the same seed (dropout included);
- for each passkit contender a target judges, its step against its torch point's, head to head:
  the median (and quartiles) of ``--pairs`` ``A B B A`` blocks of adjacent steps (``paired.py``:
  on this shared host a table's ratios drift by about 10%, adjacent pairs by about 3%).

Targets (3% noise on time, judged head to head):

- the frontier: at each torch point's bytes, passkit's plan saves no more at no more step time;
- at equal budgets: ``flops`` saves no more bytes than ``torch`` at no more step time, and is
  strictly better somewhere (the two read a budget alike but count differently: passkit's is a
  byte limit between its smallest plan and its fastest unfused one, counted per storage, which
  it always meets; torch's counts each saved value's own size and returns its first plan under
  the ratio);
- every ``max_saved`` plan measures within its limit.

Compiles use a fresh passkit cache (``PASSKIT_CACHE_DIR`` in a temporary folder).

Run: ``python benchmarks/memory_frontier.py [--models block,convbn,gpt2] [--budgets 0,0.25,0.5,0.75,1]
[--partitioners torch,flops,profile] [--pipeline training-python] [--rounds 7] [--pairs 10] [--threads 1]
[--json OUT]``. GPT-2 (transformers' ``GPT2Config()`` defaults, random init,
batch 1 x 128 tokens) compiles for minutes per contender on a small CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import passkit
from paired import PairedRatio, head_to_head, repetitions
from passkit.examples import transformer

TOLERANCE = 1.03


def block() -> tuple[nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor]]:
    model, (x,) = transformer.large_stack()  # d=256, 2 layers, input (8, 128, 256)
    return model, (x,), lambda out: (out**2).mean()


def convbn() -> tuple[nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    channels = [3, 32, 64, 64]
    for c_in, c_out in zip(channels, channels[1:]):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return model, (torch.randn(16, 3, 32, 32),), lambda out: out.logsumexp(-1).mean()


def gpt2() -> tuple[nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor]]:
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).train()
    ids = torch.randint(0, model.config.vocab_size, (1, 128))
    return _KeywordModel(model, ids), (ids,), lambda out: out.loss


class _KeywordModel(nn.Module):
    def __init__(self, model: nn.Module, labels: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.labels = labels

    def forward(self, ids: torch.Tensor) -> Any:
        return self.model(input_ids=ids, labels=self.labels)


WORKLOADS = {"block": block, "convbn": convbn, "gpt2": gpt2}


@dataclass
class Contender:
    name: str
    model: nn.Module
    run: Callable[..., Any]
    loss_fn: Callable[[Any], torch.Tensor]
    inputs: tuple[Any, ...]
    limit: int | None = None
    times: list[float] = field(default_factory=list)
    saved_bytes: int = 0
    grads: list[torch.Tensor | None] = field(default_factory=list)
    grads_equal: bool = True
    loss: float = 0.0
    compile_s: float = 0.0
    graphs: int = 1

    def step(self, hooks: Any = None) -> torch.Tensor:
        self.model.zero_grad(set_to_none=True)
        torch.manual_seed(1234)  # dropout draws the same masks in every contender
        with hooks if hooks is not None else contextlib.nullcontext():
            out = self.run(*self.inputs)
        loss = self.loss_fn(out)
        loss.backward()
        if hooks is None:  # gradients of a large model, once per contender, add up
            self.model.zero_grad(set_to_none=True)
        return loss

    def first_step(self) -> None:
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return t

        started = time.perf_counter()
        self.step()  # compiles, so the compile time is its own (a re-planned graph compiles in the next step)
        self.compile_s = time.perf_counter() - started
        # Only the model's forward: the loss outside it saves the same in every contender.
        loss = self.step(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        self.saved_bytes = sum(storages.values())
        self.loss = float(loss.detach())
        self.grads = [p.grad.detach().clone() if p.grad is not None else None for p in self.model.parameters()]


# The shipped pipeline each contender extends, and the partition step it replaces there.
BASES = {"training-python": "partition.default", "training": "partition.min_cut"}


def _pipeline(directory: Path, base: str, name: str, pass_name: str, **options: Any) -> str:
    if base == "training" and pass_name == "partition.min_cut":
        options.setdefault("fused_pointwise", True)  # as the shipped pipeline: Inductor fuses them
    lines = [
        "[pipeline]",
        f'name = "{name}"',
        f'extends = "{base}"',
        f'disable = ["{BASES[base]}"]',
        "",
        "[[steps]]",
        'id = "frontier"',
        f'pass = "{pass_name}"',
        f'after = "{BASES[base]}"',
    ]
    for key, value in options.items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {json.dumps(value)}")
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _contender(name: str, factory: Callable[[], Any], pipeline: str | None, eager: Contender | None = None) -> Contender:
    """A compiled (or, without ``pipeline``, eager) contender after its first step; compared
    with ``eager`` then, so that only eager's gradients stay in memory."""
    model, inputs, loss_fn = factory()
    run = model if pipeline is None else passkit.compile(model, pipeline=pipeline)
    contender = Contender(name, model, run, loss_fn, inputs)
    contender.first_step()
    model.zero_grad(set_to_none=True)
    if pipeline is not None:
        backend = run.passkit_backend  # re-planned graphs compile twice; count each graph once
        contender.graphs = len(backend.saved_ledger.entries) or len(backend.programs)
    if eager is not None:
        contender.grads_equal = _grads_equal(contender, eager)
        contender.grads = []
    return contender


def _grads_equal(a: Contender, b: Contender) -> bool:
    if abs(a.loss - b.loss) > 1e-4 * max(1.0, abs(b.loss)):
        return False
    for x, y in zip(a.grads, b.grads):
        if (x is None) != (y is None) or (x is not None and not torch.allclose(x, y, rtol=1e-3, atol=1e-5)):
            return False
    return True


PARTITIONERS = {
    "torch": ("partition.torch_min_cut", {}),
    "flops": ("partition.min_cut", {"estimator": "flops"}),
    "profile": ("partition.min_cut", {"estimator": "profile"}),
}


def run_workload(
    name: str, budgets: list[float], rounds: int, directory: Path, partitioners: list[str], base: str = "training-python",
    pair_repetitions: int = 10,
) -> list[dict[str, Any]]:
    factory = WORKLOADS[name]
    print(f"\n== {name}: compiling contenders", flush=True)
    contenders = [_contender("eager", factory, None)]
    for budget in budgets:
        for label in partitioners:
            pass_name, extra = PARTITIONERS[label]
            tag = f"{label}@{budget:g}"
            path = _pipeline(directory, base, f"{name}-{label}-{budget:g}", pass_name, memory_budget=budget, **extra)
            try:
                contenders.append(_contender(tag, factory, path, contenders[0]))
            except passkit.PassError as exc:  # torch's plan at budget 0 redraws dropout
                print(f"  {tag}: refused: {exc}", flush=True)
                continue
            print(f"  {tag}: compiled in {contenders[-1].compile_s:.1f}s", flush=True)
    flops = {c.name: c.saved_bytes for c in contenders if c.name.startswith("flops@")}
    low, high = flops.get("flops@0"), flops.get("flops@1")
    limits = []
    if low is not None and high is not None:
        limits += [(f"max_saved={int(low + f * (high - low))}", int(low + f * (high - low))) for f in (0.25, 0.5)]
    # The frontier point by point: passkit given exactly the bytes torch's plan saved.
    limits += [(f"flops<=torch@{c.name.split('@')[1]}", c.saved_bytes) for c in contenders
               if c.name.startswith("torch@") and c.name not in ("torch@0", "torch@1")]
    for tag, limit in limits:
        path = _pipeline(directory, base, f"{name}-{tag.replace('=', '-').replace('<', '')}", "partition.min_cut", max_saved=limit)
        try:
            contender = _contender(tag, factory, path, contenders[0])
        except passkit.PassError as exc:  # the limit is below the smallest plan passkit can make
            print(f"  {tag}: {exc}", flush=True)
            continue
        contender.limit = limit
        contenders.append(contender)
        print(f"  {tag}: compiled in {contender.compile_s:.1f}s", flush=True)
    for warm in contenders:
        warm.step()
    for r in range(rounds):
        order = contenders[r % len(contenders):] + contenders[: r % len(contenders)]
        for contender in order:
            started = time.perf_counter()
            contender.step()
            contender.times.append(time.perf_counter() - started)
    eager = contenders[0]
    eager_median = statistics.median(eager.times)
    head_to_heads = _head_to_heads({c.name: c for c in contenders}, pair_repetitions)
    rows = []
    for c in contenders:
        paired = head_to_heads.get(c.name)
        rows.append({
            "workload": name, "contender": c.name, "saved_bytes": c.saved_bytes,
            "ratio": statistics.median(c.times) / eager_median, "grads_equal": c.grads_equal,
            "limit": c.limit, "compile_s": c.compile_s, "graphs": c.graphs,
            "vs_torch": None if paired is None else paired[1].median,
            "vs_torch_quartiles": None if paired is None else [paired[1].q1, paired[1].q3],
            "torch_contender": None if paired is None else paired[0],
        })
    _print_table(rows, eager_median)
    return rows


def _head_to_heads(by_name: dict[str, Contender], repetitions: int) -> dict[str, tuple[str, PairedRatio]]:
    """Each passkit contender the targets judge, timed head to head against its torch point.

    ``flops@b`` against ``torch@b`` (equal budgets) and ``flops<=torch@b`` against ``torch@b``
    (equal bytes); see ``paired.py`` for why the verdicts read these and not the table's ratios.
    """
    pairs = {}
    for theirs in [n for n in by_name if n.startswith("torch@")]:
        budget = theirs.split("@")[1]
        for ours in (f"flops@{budget}", f"flops<={theirs}"):
            if ours in by_name and repetitions > 0:
                paired = head_to_head(by_name[ours].step, by_name[theirs].step, repetitions)
                print(f"  head to head {ours} / {theirs}: {paired}", flush=True)
                pairs[ours] = (theirs, paired)
    return pairs


def _print_table(rows: list[dict[str, Any]], eager_median: float) -> None:
    print(f"\n{'contender':<22} {'saved (KiB)':>12} {'step/eager':>10} {'grads=eager':>11} {'step/torch, paired':>26}"
          f"  (eager step {eager_median * 1e3:.1f} ms)")
    for row in rows:
        note = ""
        if row["limit"] is not None:
            note = "  within limit" if row["saved_bytes"] <= row["limit"] else "  over the limit"
            if row["graphs"] > 1:
                note += f" (for all {row['graphs']} graphs Dynamo made together)"
        paired = ""
        if row["vs_torch"] is not None:
            q1, q3 = row["vs_torch_quartiles"]
            paired = f"x{row['vs_torch']:.3f} [{q1:.3f}-{q3:.3f}] {row['torch_contender']}"
        print(f"{row['contender']:<22} {row['saved_bytes'] / 1024:>12,.0f} {row['ratio']:>10.3f} {str(row['grads_equal']):>11}"
              f" {paired:>26}{note}")


def _slower(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """More than the noise allowance slower: head to head when measured, else the table's ratios."""
    if ours.get("vs_torch") is not None and ours.get("torch_contender") == theirs["contender"]:
        return ours["vs_torch"] > TOLERANCE
    return ours["ratio"] > theirs["ratio"] * TOLERANCE


def _faster(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    if ours.get("vs_torch") is not None and ours.get("torch_contender") == theirs["contender"]:
        return ours["vs_torch"] * TOLERANCE < 1.0
    return ours["ratio"] * TOLERANCE < theirs["ratio"]


def _speed(ours: dict[str, Any]) -> str:
    if ours.get("vs_torch") is not None:
        return f"x{ours['ratio']:.3f} (x{ours['vs_torch']:.3f} of torch's step, head to head)"
    return f"x{ours['ratio']:.3f}"


def check_targets(rows: list[dict[str, Any]]) -> list[str]:
    failures = []
    by_name = {(r["workload"], r["contender"]): r for r in rows}
    for workload in sorted({r["workload"] for r in rows}):
        strictly_better = False
        for (w, name), row in by_name.items():
            if w != workload or not name.startswith("torch@"):
                continue
            ours = by_name.get((w, "flops@" + name.split("@")[1]))
            if ours is None:
                continue
            if ours["saved_bytes"] > row["saved_bytes"] or _slower(ours, row):
                failures.append(f"{workload} {name}: flops saves {ours['saved_bytes']} B at {_speed(ours)}, torch {row['saved_bytes']} B at x{row['ratio']:.3f}")
            if ours["saved_bytes"] < row["saved_bytes"] or _faster(ours, row):
                strictly_better = True
        if not strictly_better:
            failures.append(f"{workload}: passkit's frontier is nowhere strictly better than torch's")
        for row in rows:  # max_saved holds for all of a model's graphs together
            if row["workload"] == workload and row["limit"] is not None and row["saved_bytes"] > row["limit"]:
                failures.append(f"{workload} {row['contender']}: measured {row['saved_bytes']} B over its limit")
            if row["workload"] == workload and not row["grads_equal"]:
                failures.append(f"{workload} {row['contender']}: gradients differ from eager's")
    return failures


def frontier_failures(rows: list[dict[str, Any]]) -> list[str]:
    """Each torch point against passkit given the same byte limit: no more bytes, no more time."""
    failures = []
    by_name = {(r["workload"], r["contender"]): r for r in rows}
    for (workload, name), theirs in by_name.items():
        if not name.startswith("torch@") or name in ("torch@0", "torch@1"):
            continue
        ours = by_name.get((workload, "flops<=" + name))
        if ours is None:
            failures.append(f"{workload} {name}: passkit cannot plan within {theirs['saved_bytes']} B")
        elif ours["saved_bytes"] > theirs["saved_bytes"] or _slower(ours, theirs):
            failures.append(f"{workload} {name}: at torch's bytes passkit saves {ours['saved_bytes']} B at {_speed(ours)}, torch x{theirs['ratio']:.3f}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="block,convbn,gpt2")
    parser.add_argument("--budgets", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--partitioners", default="torch,flops,profile")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pairs", type=repetitions, default=10,
                        help="A B B A repetitions per head-to-head verdict pair (two ratios each); 0 judges on the table")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pipeline", choices=sorted(BASES), default="training-python",
                        help="the shipped pipeline whose partition step each contender replaces")
    parser.add_argument("--json", help="also write every row to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Every contender compiles the same forward code with its own backend; each needs its own
    # cache entry, or Dynamo stops compiling after 8 and silently runs the rest eagerly.
    torch._dynamo.config.recompile_limit = 1000
    torch._dynamo.config.accumulated_recompile_limit = 100000
    budgets = [float(b) for b in args.budgets.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as directory:
        os.environ["PASSKIT_CACHE_DIR"] = str(Path(directory) / "cache")  # every plan made afresh
        for name in args.models.split(","):
            rows += run_workload(name, budgets, args.rounds, Path(directory), args.partitioners.split(","), args.pipeline,
                                  args.pairs)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    frontier = frontier_failures(rows)
    print("\nfrontier (passkit given each torch point's bytes): "
          + ("no more bytes at no more time, every point" if not frontier else "NOT MET"))
    for failure in frontier:
        print("  " + failure)
    failures = check_targets(rows)
    print("\ntargets at equal budgets: " + ("all met" if not failures else "NOT MET"))
    for failure in failures:
        print("  " + failure)
    return 1 if failures or frontier else 0


if __name__ == "__main__":
    raise SystemExit(main())
