"""docs/export.md works as written: its worked example runs from a model to a package, and the
refusals it quotes are the ones passkit prints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import passkit

DOC = Path(__file__).resolve().parents[2] / "docs" / "export.md"


def _blocks(language: str) -> list[str]:
    """The doc's fenced blocks opened with ```language (``""``: with no language)."""
    blocks: list[str] = []
    lines: list[str] | None = None  # the open block's lines; None outside a block
    wanted = False
    for line in DOC.read_text().splitlines():
        if not line.startswith("```"):
            if lines is not None:
                lines.append(line)
        elif lines is None:
            lines, wanted = [], line[3:] == language
        else:
            if wanted:
                blocks.append("\n".join(lines))
            lines = None
    return blocks


@pytest.mark.slow
def test_the_worked_example_runs_from_a_model_to_a_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (example,) = [block for block in _blocks("python") if "passkit.package" in block]
    exec(compile(example, str(DOC), "exec"), {})
    printed = capsys.readouterr().out
    assert "pipeline export" in printed and printed.strip().endswith("export")
    assert (tmp_path / "gpt2.pt2").is_file() and (tmp_path / "gpt2-aoti.pt2").is_file()


def test_the_quoted_refusals_are_what_passkit_prints(tmp_path: Path) -> None:
    quoted = [line for block in _blocks("") for line in block.splitlines() if line.startswith(("passkit/", "passkit."))]
    model = torch.nn.Linear(4, 4).eval()
    with pytest.raises(passkit.PipelineError) as refused:
        passkit.export(model, (torch.randn(2, 4),), pipeline="training")
    assert str(refused.value) in quoted
    full = tmp_path / "full.toml"
    full.write_text('[pipeline]\nname = "export-full"\nextends = "export"\n\n[override.decompose]\ntables = ["full"]\n')
    exported = passkit.export(model, (torch.randn(2, 4),), pipeline=str(full))
    with pytest.raises(passkit.PasskitError) as refused_package:
        passkit.package(exported, tmp_path / "p.pt2")
    assert str(refused_package.value) in quoted
