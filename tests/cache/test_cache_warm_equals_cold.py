"""Warm equals cold: a program loaded from the compile cache computes exactly what the process
that compiled it computed, for every shipped pipeline, and both agree with eager.

Two processes share one temporary ``PASSKIT_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR``; each
runs ``cache_child.py --programs`` (dropout, BatchNorm in training, an in-place input mutation,
an aliased output, the zoo's GPT-2 and a module whose batch size changes 2 -> 3 -> 4, so that
its second graph has a symbolic batch; each eagerly and compiled from the same seeds). The first
compiles, the second loads: same random draws, same mutations written back, same gradients.
Both run with ``torch.use_deterministic_algorithms(True)``: without it Inductor's embedding
backward (GPT-2's ``wte``) adds from several threads in whatever order they run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from passkit.cache.store import CACHE_ENV

pytestmark = pytest.mark.slow

CHILD = Path(__file__).resolve().parents[1] / "cache_child.py"
ROOT = Path(__file__).resolve().parents[2]
# Two groups, so that a parallel run spreads them: passkit's Python codegen, and Inductor's.
GROUPS = {"python": ["training-python", "inference-python"], "inductor": ["training", "inference", "debug"]}
# ``debug`` verifies and dumps every step, so it never reads the cache: the second process
# compiles again, and must still agree.
READS_THE_CACHE = {"training-python", "inference-python", "training", "inference"}
PROGRAMS = ["dropout", "batchnorm", "input mutation", "aliased output", "gpt2", "dynamic batch"]


def _run(tmp_path: Path, out: Path, pipelines: list[str]) -> dict:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(CHILD), "--programs", str(out), *pipelines], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_program_loaded_from_the_cache_computes_what_the_compiled_one_did(group: str, tmp_path: Path) -> None:
    pipelines = GROUPS[group]
    cold = _run(tmp_path, tmp_path / "cold.pt", pipelines)
    warm = _run(tmp_path, tmp_path / "warm.pt", pipelines)
    assert sorted(cold) == sorted((p, name) for p in pipelines for name in PROGRAMS)
    problems = []
    for key in sorted(cold):
        pipeline, program = key
        first, second = cold[key], warm[key]
        if "error" in first["compiled"] or "error" in second["compiled"]:
            problems.append(f"{key}: compiling process: {first['compiled'].get('error', 'ok')}; "
                            f"loading process: {second['compiled'].get('error', 'ok')}")
            continue
        assert first["cache"] and set(first["cache"]) == ({"miss"} if pipeline in READS_THE_CACHE else {""}), key
        if program == "dynamic batch":  # batch 2 static, then one symbolic graph for batches 3 and 4
            assert len(first["cache"]) == len(second["cache"]) == 2, key
        assert set(second["cache"]) == ({"hit"} if pipeline in READS_THE_CACHE else {""}), key
        # Warm equals cold, bit for bit: the same masks, running statistics and gradients.
        if second["compiled"]["aliased"] != first["compiled"]["aliased"]:
            problems.append(f"{key}: outputs alias inputs differently after loading")
        pairs = list(zip(second["compiled"]["values"], first["compiled"]["values"]))
        assert len(pairs) == len(first["compiled"]["values"]) == len(second["compiled"]["values"]), key
        differ = [k for k, (a, b) in enumerate(pairs) if not torch.equal(a, b)]
        if differ:
            problems.append(f"{key}: values {differ} differ between the compiling and the loading process")
        # And both equal eager (Inductor's kernels round differently; the masks are eager's).
        for label, run in (("compiling", first), ("loading", second)):
            if run["compiled"]["aliased"] != run["eager"]["aliased"]:
                problems.append(f"{key}: {label} process: outputs alias inputs unlike eager's")
            for k, (a, b) in enumerate(zip(run["compiled"]["values"], run["eager"]["values"])):
                try:
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
                except AssertionError as exc:
                    problems.append(f"{key}: {label} process: value {k} differs from eager: {str(exc).splitlines()[0]}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
