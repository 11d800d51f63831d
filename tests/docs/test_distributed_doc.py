"""docs/distributed.md's SimpleFSDP example runs as written, launched with the command the page
gives (``torchrun --nproc-per-node 2``), and prints what the page shows."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "distributed.md"


def test_the_example_runs_on_two_ranks_with_the_pages_torchrun_command(tmp_path: Path) -> None:
    text = DOC.read_text()
    (example,) = re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    (console,) = re.findall(r"^```console\n\$ (.*?)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    command, shown = console
    argv = shlex.split(command)
    assert argv[:3] == ["torchrun", "--nproc-per-node", "2"]
    (tmp_path / argv[-1]).write_text(example)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv[1:]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    # The two ranks print at once: their lines may come out interleaved on torchrun's stdout.
    assert sorted(re.findall(r"rank \d: \[[^\]]*\]", result.stdout)) == shown.splitlines()
