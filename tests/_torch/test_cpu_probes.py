"""Inductor's CPU probes run once per machine: a later process, or one of several started
together, adopts the recorded answer (``passkit._torch.cpu_probes``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA present the first kernels are Triton's: no CPU probes"),
    pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                       reason="the answer is carried over on x86-64 Linux only"),
]

CHILD = """
import json
import sys

from torch._inductor import cpu_vec_isa

built = []
check_build = cpu_vec_isa.VecISA.check_build


def counted(self, code):
    built.append(str(self))
    return check_build(self, code)


cpu_vec_isa.VecISA.check_build = counted
from passkit import _torch
from passkit._torch import cpu_probes

_torch.start_cpu_probes()
_torch.cpu_probes_settled()
answer = cpu_vec_isa.valid_vec_isa_list()
print(json.dumps({"probed": built, "thread": cpu_probes._probes is not None, "answer": [[str(isa), isa.build_arch_flags()] for isa in answer],
                  "picked": str(cpu_vec_isa.pick_vec_isa())}))
"""


def _start(inductor_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir)}
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_second_process_adopts_the_first_ones_answer_without_probing(tmp_path) -> None:
    first = _result(_start(tmp_path))
    assert first["probed"], "the first process on a machine probes"
    [recorded] = (tmp_path / "passkit").glob("cpu-probes-*.json")
    second = _result(_start(tmp_path))
    assert second["probed"] == []
    assert first["thread"] and not second["thread"]  # adopted at once: no thread, no setuptools import
    assert second["answer"] == first["answer"]  # the same sets, each with the same compiler flags
    assert second["picked"] == first["picked"]
    assert json.loads(recorded.read_text())["machine"]["torch"] == torch.__version__


def test_processes_started_together_probe_once(tmp_path) -> None:
    results = [_result(process) for process in [_start(tmp_path) for _ in range(3)]]
    assert sum(bool(result["probed"]) for result in results) == 1
    assert len({json.dumps(result["answer"]) for result in results}) == 1


@pytest.mark.parametrize("damage", ["flags", "not json"])
def test_an_answer_that_does_not_rebuild_its_flags_or_does_not_read_is_ignored_and_the_probes_run(tmp_path, damage) -> None:
    first = _result(_start(tmp_path))
    [recorded] = (tmp_path / "passkit").glob("cpu-probes-*.json")
    answer = json.loads(recorded.read_text())
    if not answer["sets"]:
        pytest.skip("this CPU has no vector instruction set Inductor uses")
    answer["sets"][0]["flags"] += " -mtampered"
    recorded.write_text(json.dumps(answer) if damage == "flags" else "{not json")
    again = _result(_start(tmp_path))
    assert again["probed"]
    assert again["answer"] == first["answer"]
