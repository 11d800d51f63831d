"""Dynamo tracing a frame for passkit says so; each graph's compile opens with a line naming it;
a recompile names what changed since the previous compile of the same frame: shapes, dtypes,
requires-grad, grad mode."""

from __future__ import annotations

import logging
import re

import pytest
import torch

import passkit
from passkit.core import progress
pytestmark = pytest.mark.slow  # four compiles through Dynamo


def scale(x: torch.Tensor) -> torch.Tensor:
    return (x.sin() * 2).cos()


WHERE = f"scale at test_recompiles.py:{scale.__code__.co_firstlineno}"


def _compile_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "passkit" and "compiling graph" in r.getMessage()]


def test_recompiles_name_the_graph_and_what_changed(caplog: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    compiled = passkit.compile(scale, pipeline="training-python", dynamic=False)
    with caplog.at_level(logging.INFO, logger="passkit"):
        compiled(torch.randn(2, 4, requires_grad=True))
        compiled(torch.randn(3, 4, requires_grad=True))
        compiled(torch.randn(3, 4, dtype=torch.float64, requires_grad=True))
        with torch.no_grad():
            compiled(torch.randn(3, 4, dtype=torch.float64, requires_grad=True))
        compiled(torch.randn(3, 4, dtype=torch.float64))
    lines = _compile_lines(caplog)
    frame = re.search(r"Dynamo frame (\d+)/0", lines[0]).group(1)  # type: ignore[union-attr]
    assert lines == [
        f"compiling graph 1: {WHERE} (Dynamo frame {frame}/0), inputs x float32[2, 4]",
        f"recompiling graph 2: {WHERE} (Dynamo frame {frame}/1): x float32[2, 4] -> float32[3, 4]",
        f"recompiling graph 3: {WHERE} (Dynamo frame {frame}/2): x float32[3, 4] -> float64[3, 4]",
        f"recompiling graph 4: {WHERE} (Dynamo frame {frame}/3): grad mode on -> off",
        f"recompiling graph 5: {WHERE} (Dynamo frame {frame}/4): grad mode off -> on; x requires grad yes -> no",
    ]


def test_dynamo_tracing_says_so_before_the_graph_reaches_passkit(caplog: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    compiled = passkit.compile(scale, pipeline="training-python", dynamic=False)
    with caplog.at_level(logging.INFO, logger="passkit"):
        compiled(torch.randn(2, 4))
    lines = [r.getMessage() for r in caplog.records if r.name == "passkit"]
    frame = re.search(r"Dynamo frame (\d+)/0", lines[0]).group(1)  # type: ignore[union-attr]
    assert lines[:2] == [
        f"Dynamo is tracing {WHERE} (Dynamo frame {frame}/0)",
        f"compiling graph 1: {WHERE} (Dynamo frame {frame}/0), inputs x float32[2, 4]",
    ]


def test_another_backend_gets_no_tracing_line(caplog: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    passkit.backend("training-python")  # installs passkit's hook on Dynamo's start callbacks
    with caplog.at_level(logging.INFO, logger="passkit"):
        torch.compile(scale, backend="eager")(torch.randn(2, 4))
    assert [r.getMessage() for r in caplog.records if r.name == "passkit"] == []


def test_the_compile_line_comes_before_the_first_step(caplog: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()

    class Callback:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def __call__(self, record: object) -> None:
            self.seen.append(f"step {record.id}")  # type: ignore[attr-defined]

        def event(self, event: progress.ProgressEvent) -> None:
            self.seen.append(f"{event.kind} {event.graph}")

    callback = Callback()
    compiled = passkit.compile(scale, pipeline="training-python", dynamic=False, progress=callback)
    compiled(torch.randn(2, 4))
    assert callback.seen[:3] == ["tracing ", "compiling graph 1", "step functionalize"]


FIRST_FRAME_CHILD = """
import logging, os, sys
import torch

class StopAtTheGraph(logging.Handler):
    def emit(self, record):
        print(record.getMessage(), flush=True)
        if record.getMessage().startswith("compiling graph"):
            os._exit(0)  # the lines before passkit compiles are all this test reads

logging.getLogger("passkit").addHandler(StopAtTheGraph())
logging.getLogger("passkit").setLevel(logging.INFO)

def scale(x):
    return (x.sin() * 2).cos()

torch.compile(scale, backend="passkit")(torch.randn(2, 4))
"""


def test_the_first_frame_under_the_registered_backend_name_gets_its_tracing_line(tmp_path) -> None:
    # A fresh process: torch loads the "passkit" entry point (importing passkit.frontends.api) only once.
    import os
    import subprocess
    import sys

    (tmp_path / "first.py").write_text(FIRST_FRAME_CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "first.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    where = f"scale at first.py:{FIRST_FRAME_CHILD.splitlines().index('def scale(x):') + 1}"
    assert done.stdout.splitlines() == [
        f"Dynamo is tracing {where} (Dynamo frame 0/0)",
        f"compiling graph 1: {where} (Dynamo frame 0/0), inputs x float32[2, 4]",
    ]
