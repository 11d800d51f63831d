"""Deployment through passkit against torch's own path: export time, package build time, and the
packaged model's run time.

Workloads: Hugging Face GPT-2 with 12 layers at its defaults (SDPA attention, ``use_cache=False``;
hidden 128, 4 heads, vocabulary 1000, input ids (4, 64)), and the 24-layer block stack
(``passkit.examples.transformer``, d=64, input (4, 32, 64)), both in eval mode.

Contenders:
- export: ``passkit.export(model, ...)`` (the ``export`` pipeline, compile cache off) against
  ``torch.export.export(model, ...).run_decompositions()`` (Core ATen). On GPT-2 torch's Core
  ATen program fails ("Cannot view a tensor ..."), so torch's figure there is its export with
  the fused attention left whole (``run_decompositions`` with that op taken out of the table),
  and the table says so.
- package: ``passkit.package(passkit's program)`` against
  ``aoti_compile_and_package(torch.export.export(model, ...))``, the path torch documents (AOTInductor
  lowers torch.export's program with Inductor's own table, fused attention kept whole), each
  with Inductor's caches off (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``, set before torch is
  imported).
- run: the two packages loaded with ``aoti_load_package`` and called head to head
  (``paired.head_to_head``: ``A B B A`` blocks, the median of adjacent ratios and its quartiles).

Export times are medians over ``--rounds`` rounds, the contenders interleaved in an order that
alternates each round; ratios are passkit's over torch's. Package builds take a minute each on a
2-core CPU, so they run ``--package-rounds`` times (default 1).

Run: ``python benchmarks/export.py [--workloads gpt2,stack24] [--rounds 3] [--package-rounds 1]
[--pairs 200] [--threads 2] [--json OUT]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired import head_to_head  # noqa: E402

SDPA_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def gpt2() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=12, n_head=4)).eval()
    ids = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(1))
    return model, (), {"input_ids": ids, "use_cache": False}


def stack24() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from passkit.examples.transformer import TransformerStack

    torch.manual_seed(0)
    model = TransformerStack(24, 64, 4).eval()
    return model, (torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(1)),), {}


WORKLOADS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]] = {
    "gpt2": gpt2, "stack24": stack24,
}


def torch_form(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, Any] | None:
    """The table torch's Core ATen export of this model runs with: its default (None), or, where
    that program cannot be made or run, the default with the fused attention left whole. Probed
    once, before timing, so a failed attempt is never timed."""
    try:
        torch.export.export(model, args, kwargs).run_decompositions().module()(*args, **kwargs)
        return None
    except Exception:  # noqa: BLE001 - torch's own Core ATen program fails: take its nearest working form
        table = torch.export.default_decompositions()
        table.pop(SDPA_CPU, None)
        return table


def torch_export(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], table: Any) -> Any:
    exported = torch.export.export(model, args, kwargs)
    return exported.run_decompositions() if table is None else exported.run_decompositions(table)


def passkit_export(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import passkit

    return passkit.export(model, args, kwargs, cache="off", progress=lambda record: None)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def run_workload(name: str, rounds: int, package_rounds: int, pairs: int, folder: Path) -> dict[str, Any]:
    import passkit
    from torch._inductor import aoti_compile_and_package, aoti_load_package

    model, args, kwargs = WORKLOADS[name]()
    times: dict[str, list[float]] = {"passkit": [], "torch": []}
    programs: dict[str, Any] = {}
    table = torch_form(model, args, kwargs)
    for k in range(rounds):
        order = ["passkit", "torch"] if k % 2 == 0 else ["torch", "passkit"]
        for who in order:
            if who == "passkit":
                seconds, programs["passkit"] = timed(lambda: passkit_export(model, args, kwargs))
            else:
                seconds, programs["torch"] = timed(lambda: torch_export(model, args, kwargs, table))
            times[who].append(seconds)
        print(f"  {name} round {k + 1}: export passkit {times['passkit'][-1]:.2f} s, torch {times['torch'][-1]:.2f} s",
              file=sys.stderr, flush=True)
    builds: dict[str, list[float]] = {"passkit": [], "torch": []}
    packages: dict[str, str] = {}
    for k in range(package_rounds):
        order = ["passkit", "torch"] if k % 2 == 0 else ["torch", "passkit"]
        for who in order:
            path = folder / f"{name}-{who}-{k}.pt2"
            if who == "passkit":
                seconds, packages[who] = timed(lambda: passkit.package(programs["passkit"], path))
            else:
                seconds, packages[who] = timed(lambda: aoti_compile_and_package(
                    torch.export.export(model, args, kwargs), package_path=str(path)))
            builds[who].append(seconds)
        print(f"  {name} package {k + 1}: passkit {builds['passkit'][-1]:.1f} s, torch {builds['torch'][-1]:.1f} s",
              file=sys.stderr, flush=True)
    ours, theirs = aoti_load_package(packages["passkit"]), aoti_load_package(packages["torch"])
    with torch.no_grad():
        expected = model(*args, **kwargs)
        got = ours(*args, **kwargs)
    error = max((a - b).abs().max().item() for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)))
    with torch.no_grad():
        ratio = head_to_head(lambda: ours(*args, **kwargs), lambda: theirs(*args, **kwargs), repetitions=pairs // 2)
    return {
        "workload": name,
        "torch_form": "core aten" if table is None else "core aten, SDPA kept",
        "export_passkit_s": statistics.median(times["passkit"]),
        "export_torch_s": statistics.median(times["torch"]),
        "package_passkit_s": statistics.median(builds["passkit"]),
        "package_torch_s": statistics.median(builds["torch"]),
        "run_ratio": ratio.median, "run_q1": ratio.q1, "run_q3": ratio.q3, "run_pairs": ratio.pairs,
        "package_vs_eager_max_diff": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="gpt2,stack24")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--package-rounds", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", dest="json_out", default=None)
    options = parser.parse_args()
    unknown = [w for w in options.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
    torch.set_num_threads(options.threads)
    warnings.simplefilter("ignore", FutureWarning)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in options.workloads.split(","):
            rows.append(run_workload(name, options.rounds, options.package_rounds, options.pairs, Path(folder)))
    print(f"\n{'workload':<9} {'export: passkit':>16} {'torch':>8} {'ratio':>7}   {'package: passkit':>17} {'torch':>8} "
          f"{'ratio':>7}   {'run: passkit/torch':>26}")
    for row in rows:
        print(f"{row['workload']:<9} {row['export_passkit_s']:>15.2f}s {row['export_torch_s']:>7.2f}s "
              f"x{row['export_passkit_s'] / row['export_torch_s']:>6.2f}   {row['package_passkit_s']:>16.1f}s "
              f"{row['package_torch_s']:>7.1f}s x{row['package_passkit_s'] / row['package_torch_s']:>6.2f}   "
              f"x{row['run_ratio']:.3f} [{row['run_q1']:.3f}-{row['run_q3']:.3f}] ({row['run_pairs']} pairs)")
        if row["torch_form"] != "core aten":
            print(f"  {row['workload']}: torch's Core ATen program fails to run; its figures are for {row['torch_form']}")
    if options.json_out:
        Path(options.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
