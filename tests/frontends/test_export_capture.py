"""A model ``torch.export`` cannot capture is the user's to fix: ``passkit.export`` raises a
``CaptureError`` of one line naming the model's line and torch's reason (torch's own error
chained as its context), and ``passkit export`` exits 2 with that line alone; torch's graph dump
and log lines show only with ``PASSKIT_DEBUG=1``."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main

MODELS = textwrap.dedent(
    '''
    import torch


    class Raises(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            if x.shape[0] != 99:
                raise ValueError("expected a batch of 99")
            return self.fc(x)


    class Branch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            if x.sum() > 0:
                return self.fc(x)
            return -self.fc(x)


    def raises():
        return Raises().eval(), (torch.randn(3, 8),)


    def branch():
        return Branch().eval(), (torch.randn(3, 8),)


    def linear():
        return torch.nn.Sequential(torch.nn.Linear(8, 4)).eval(), (torch.randn(3, 8),)
    '''
)

RAISES = ('Raises raised ValueError: expected a batch of 99 at capture_models.py:12 in forward '
          '(raise ValueError("expected a batch of 99"))')
BRANCH = ("torch.export cannot capture Branch at capture_models.py:22 in forward (if x.sum() > 0:): "
          "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1) (unhinted: Eq(u0, 1)).")
LINEAR = ("torch.export cannot capture Sequential: UserError: Constraints violated (dim1)! You marked dim1 as dynamic "
          "but your code specialized it to be a constant (8).")
FULL = " (PASSKIT_DEBUG=1 shows the full error)"


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "capture_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
    sys.modules.pop("capture_models", None)
    return importlib.import_module("capture_models")


CASES = [("raises", None, RAISES), ("branch", None, BRANCH), ("linear", {"input": {1: torch.export.Dim("dim1")}}, LINEAR)]


@pytest.mark.parametrize(("factory", "dynamic", "message"), CASES, ids=[c[0] for c in CASES])
def test_passkit_export_raises_one_line_chaining_torchs_error(models, capfd, factory, dynamic, message) -> None:
    model, args = getattr(models, factory)()
    with pytest.raises(Exception) as torchs:  # torch's own path fails the same way
        torch.export.export(model, args, dynamic_shapes=dynamic)
    capfd.readouterr()
    with pytest.raises(passkit.CaptureError) as caught:
        passkit.export(model, args, dynamic_shapes=dynamic)
    assert str(caught.value) == f"passkit.export: {message}{FULL}"
    assert type(caught.value.__context__) is type(torchs.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert capfd.readouterr().err == ""  # no graph dump, no log line


@pytest.mark.parametrize(("factory", "dynamic", "message"), CASES, ids=[c[0] for c in CASES])
def test_passkit_export_command_exits_2_with_the_line_alone(models, capfd, factory, dynamic, message) -> None:
    extra = ["--dynamic", "1"] if dynamic else []
    result = CliRunner().invoke(main, ["export", "export", "--model", f"capture_models:{factory}", "-o", "m.pt2", *extra])
    assert (result.exit_code, result.stderr.splitlines()) == (2, [
        f"passkit export: exporting capture_models:{factory} with export (4 steps) ...",
        f"passkit.export: {message}{FULL}",
    ])
    assert capfd.readouterr().err == ""
    assert not Path("m.pt2").exists()


def test_passkit_debug_shows_torchs_full_error_as_the_cause(models, monkeypatch, capfd) -> None:
    monkeypatch.setenv("PASSKIT_DEBUG", "1")
    model, args = models.branch()
    with pytest.raises(passkit.CaptureError) as caught:
        passkit.export(model, args)
    assert isinstance(caught.value.__cause__, torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode)
    assert "def forward(self" in capfd.readouterr().err  # torch's partial graph, as torch prints it
