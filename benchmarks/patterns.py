"""Measure what each post-grad pass and pattern set buys: training step time, saved and allocated bytes.

Contenders, all from ``training-python`` (which ships the ``attention`` rewrite step):

- ``eager``: the model itself;
- ``shipped``: ``training-python`` as it is;
- ``-attention``: with its ``attention`` step disabled;
- ``+gemm``: plus ``fx.cse`` and a ``rewrite`` step with the ``gemm`` set after ``decompose``
  (pre-grad; ``gemm`` needs each linear's view of a shared activation merged first);
- ``+noops``: plus a ``rewrite`` step with the ``noops`` set after ``attention``;
- ``+reinplace``: plus a ``reinplace`` step after ``fx.dce`` (post-grad);
- ``+all``: the three additions together.

Workloads:

- ``block256``: the d=256, 2-layer transformer stack of ``passkit/examples/transformer.py``
  (``large_stack``: input 8 x 128 x 256);
- ``gpt2``: Hugging Face GPT-2 at its default config (12 layers, d=768) with
  ``attn_implementation="eager"``, input ids 2 x 128, ``eval()`` so dropout draws nothing;
- ``llama``: Hugging Face Llama at its default settings (SDPA attention, SiLU MLP, no biases,
  ``num_key_value_heads`` = heads) with sizes made CPU-sized: 4 layers, d=512, MLP 1408,
  8 heads, vocabulary 8192; input ids 2 x 128.

Method: each contender compiles its own deep copy of the model (compile time is its first
step), takes two warm-up steps, then all contenders are timed round by round in an order that
rotates each round; the median and minimum step times are reported, with the ratio of medians
to eager's and to ``shipped``'s from the same run. ``saved`` is the partition step's
``saved_bytes`` (what the forward keeps for the backward). ``alloc`` and ``peak`` come from one
extra step under ``torch.profiler`` with ``profile_memory``: bytes the allocator handed out, and
the most that was live at once. ``applied`` counts rewrites per step (``att``, ``gemm``,
``noops``) and ops made in-place (``ri``). The load average is printed before and after.

Run: ``python benchmarks/patterns.py [--workloads block256,gpt2,llama] [--rounds N]
[--threads 2] [--variants shipped,-attention,+gemm,+noops,+reinplace,+all] [--json OUT]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from allocations import allocations  # noqa: E402

BASELINE = "training-python"


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def _gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config()
    config._attn_implementation = "eager"
    model = transformers.GPT2LMHeadModel(config).eval()
    return _Logits(model), (torch.randint(0, config.vocab_size, (2, 128)),)


def _llama() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, vocab_size=8192
    )
    model = transformers.LlamaForCausalLM(config)
    return _Logits(model), (torch.randint(0, config.vocab_size, (2, 128)),)


WORKLOADS: dict[str, tuple[Callable[[], Any], int]] = {
    "block256": (transformer.large_stack, 10),
    "gpt2": (_gpt2, 5),
    "llama": (_llama, 7),
}

_GEMM = (
    '[[steps]]\nid = "pre_cse"\npass = "fx.cse"\nafter = "decompose"\n\n'
    '[[steps]]\nid = "gemm"\npass = "rewrite"\npatterns = ["gemm"]\nafter = "pre_cse"\n\n'
)
_NOOPS = '[[steps]]\nid = "noops"\npass = "rewrite"\npatterns = ["noops"]\nafter = "attention"\n\n'
_REINPLACE = '[[steps]]\npass = "reinplace"\nafter = "fx.dce"\n\n'
VARIANTS: dict[str, str | None] = {
    "eager": None,
    "shipped": "",
    "-attention": 'disable = ["attention"]\n\n',
    "+gemm": _GEMM,
    "+noops": _NOOPS,
    "+reinplace": _REINPLACE,
    "+all": _GEMM + _NOOPS + _REINPLACE,
}


def _pipeline(folder: Path, label: str, body: str) -> str:
    if not body:
        return BASELINE
    path = folder / f"{label.strip('+-')}.toml"
    head, steps = (body, "") if body.startswith("disable") else ("", body)
    path.write_text(f'[pipeline]\nname = "{label.strip("+-")}"\nextends = "{BASELINE}"\n{head}\n{steps}')
    return str(path)


def _records(compiled: Any) -> list[Any]:
    return [record for report in getattr(compiled, "passkit_reports", []) for record in report.records]


def _saved_bytes(compiled: Any) -> int | None:
    found = [r.stats["saved_bytes"] for r in _records(compiled) if r.pass_name.startswith("partition") and "saved_bytes" in r.stats]
    return sum(found) if found else None


def _applied(compiled: Any) -> str:
    parts = []
    for record in _records(compiled):
        if record.pass_name == "rewrite" and record.status == "ran":
            parts.append(f"{record.id[:5]}={record.stats.get('rewrites', 0)}")
        elif record.pass_name == "reinplace" and record.status == "ran":
            parts.append(f"ri={record.stats.get('reinplaced', 0)}")
    return " ".join(parts) or "-"


class Contender:
    def __init__(self, label: str, pipeline: str | None, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self.label = label
        self.model = copy.deepcopy(model)
        self.inputs = inputs
        started = time.perf_counter()
        self.compiled = self.model if pipeline is None else passkit.aot_module(self.model, pipeline=pipeline, cache="off")
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


def run(workload: str, variants: list[str], rounds: int | None, folder: Path) -> list[dict[str, Any]]:
    factory, default_rounds = WORKLOADS[workload]
    model, inputs = factory()
    labels = ["eager"] + [v for v in variants if v != "eager"]
    contenders = []
    for label in labels:
        print(f"  compiling {workload}/{label} ...", file=sys.stderr, flush=True)
        body = VARIANTS[label]
        contenders.append(Contender(label, None if body is None else _pipeline(folder, label, body), model, inputs))
    for contender in contenders:
        for _ in range(2):
            contender.step()
    total = rounds or default_rounds
    for index in range(total):
        shift = index % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            contender.timed_step()
        print(f"  round {index + 1}/{total}, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    medians = {c.label: statistics.median(c.times) for c in contenders}
    rows = []
    for contender in contenders:
        allocated, peak = allocations(contender.step)
        median = medians[contender.label]
        rows.append(
            {
                "workload": workload,
                "variant": contender.label,
                "median_ms": median * 1000,
                "min_ms": min(contender.times) * 1000,
                "vs_eager": median / medians["eager"],
                "vs_shipped": median / medians["shipped"] if "shipped" in medians else None,
                "saved_bytes": _saved_bytes(contender.compiled),
                "allocated_bytes": allocated,
                "peak_bytes": peak,
                "applied": _applied(contender.compiled),
                "compile_s": contender.compile_s,
            }
        )
    return rows


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="block256,gpt2,llama")
    parser.add_argument("--variants", default="shipped,-attention,+gemm,+noops,+reinplace,+all")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r} (known: {', '.join(VARIANTS)})")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for workload in args.workloads.split(","):
            rows += run(workload, args.variants.split(","), args.rounds, Path(folder))
    print(f"load after: {os.getloadavg()[0]:.1f}")
    header = (
        f"{'workload':<9} {'variant':<11} {'median ms':>10} {'min ms':>9} {'/eager':>7} {'/shipped':>8} "
        f"{'saved MiB':>9} {'alloc MiB':>9} {'peak MiB':>8} {'compile s':>9}  applied"
    )
    print(header)
    for r in rows:
        shipped = "-" if r["vs_shipped"] is None else f"{r['vs_shipped']:.3f}"
        print(
            f"{r['workload']:<9} {r['variant']:<11} {r['median_ms']:>10.1f} {r['min_ms']:>9.1f} {r['vs_eager']:>7.3f} "
            f"{shipped:>8} {_mib(r['saved_bytes']):>9} {_mib(r['allocated_bytes']):>9} {_mib(r['peak_bytes']):>8} "
            f"{r['compile_s']:>9.1f}  {r['applied']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
