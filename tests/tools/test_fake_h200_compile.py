"""``tools/fake-h200-compile``: Inductor's GPU compile of GPT-2 and Llama checked without a GPU.
It needs a CUDA build of torch; on this CPU build it says so in one line (docs/gpu.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fake-h200-compile"


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks a CPU build of torch")
def test_a_cpu_build_of_torch_is_one_line_and_exit_2() -> None:
    result = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"fake-h200-compile: needs a CUDA build of torch (this is {torch.__version__}); "
                             "no GPU is needed\n")


def test_an_unknown_model_is_one_line() -> None:
    result = subprocess.run([sys.executable, str(TOOL), "--models", "gpt2,bert"], capture_output=True, text=True,
                            timeout=300)
    assert (result.returncode, result.stderr) == (2, "fake-h200-compile: unknown --models 'bert'; choose from gpt2, llama\n")
