"""Programs with outlined regions in the compile cache: a block stack whose layers the ``regions``
step outlined into one shared ``invoke_subgraph`` body is stored with its bodies, and a second
process loads it, runs no step, finds both of Inductor's graphs in its FX graph cache under the
stored keys, and computes bit for bit what the compiling process did (seeded dropout included).

Each process runs ``cache_child.py --regions``; they share one temporary ``PASSKIT_CACHE_DIR``
and ``TORCHINDUCTOR_CACHE_DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import passkit
from passkit.cache.store import CACHE_ENV

pytestmark = pytest.mark.slow

CHILD = Path(__file__).resolve().parents[1] / "cache_child.py"
ROOT = Path(__file__).resolve().parents[2]
REPEATS = {"layers.* (_DropoutBlock, 31 nodes)": 4}  # the first layer too, on an input needing no grad


def _run_child(tmp_path: Path, pipeline: str, inductor_cache: str = "inductor") -> dict:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / inductor_cache),
           "CHILD_PIPELINE": pipeline}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(CHILD), "--regions"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _close_to_eager(run: dict) -> None:
    torch.testing.assert_close(
        [torch.tensor(run["out"]), *map(torch.tensor, run["grads"])],
        [torch.tensor(run["eager_out"]), *map(torch.tensor, run["eager_grads"])],
        rtol=1e-4, atol=1e-5,
    )


def test_a_block_stack_with_outlined_regions_loads_from_inductors_cache_in_a_second_process(tmp_path: Path) -> None:
    cold = _run_child(tmp_path, "training")
    warm = _run_child(tmp_path, "training")
    assert cold["repeats"] == warm["repeats"] == REPEATS  # the warm one's from the stored report
    assert (cold["cache"], warm["cache"]) == ("miss", "hit")
    steps = len(passkit.load_pipeline("training").steps)  # the overlay turns training's own regions on
    assert cold["passes_run"] == steps and warm["passes_run"] == 0
    # The forward and the backward, each calling the shared body: found in Inductor's FX graph
    # cache under the keys the cold process filed them under, so no graph was hashed or lowered.
    assert cold["inductor"] == {"hit": 0, "miss": 2, "bypass": 0}
    assert warm["inductor"] == {"hit": 2, "miss": 0, "bypass": 0}
    assert (cold["graphs_hashed"], warm["graphs_hashed"]) == (2, 0)
    assert (warm["out"], warm["grads"]) == (cold["out"], cold["grads"])  # dropout masks too
    _close_to_eager(warm)
    assert len(list((tmp_path / "cache").glob("*.entry"))) == 1


def test_an_emptied_inductor_cache_gets_the_graphs_and_bodies_code_back_from_the_entry(tmp_path: Path) -> None:
    cold = _run_child(tmp_path, "training")
    again = _run_child(tmp_path, "training", inductor_cache="emptied")
    assert (again["cache"], again["passes_run"]) == ("hit", 0)
    # The entry carries Inductor's files for both graphs, bodies inside: nothing is lowered again.
    assert again["inductor"] == {"hit": 2, "miss": 0, "bypass": 0}
    assert (again["out"], again["grads"]) == (cold["out"], cold["grads"])


def test_codegen_python_stores_a_program_with_outlined_regions_too(tmp_path: Path) -> None:
    cold = _run_child(tmp_path, "training-python")
    warm = _run_child(tmp_path, "training-python")
    assert cold["repeats"] == REPEATS
    assert (cold["cache"], warm["cache"], warm["passes_run"]) == ("miss", "hit", 0)
    assert (warm["out"], warm["grads"]) == (cold["out"], cold["grads"])
    _close_to_eager(warm)
