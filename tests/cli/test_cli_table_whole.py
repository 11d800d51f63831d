"""A step table stays whole when stdout and stderr share one pipe: progress lines come before it,
warnings and torch's log lines after its summary (``passkit.core.held_output``)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from passkit.core.held_output import HeldOutput

pytestmark = pytest.mark.slow

NOISY = textwrap.dedent(
    '''
    import logging
    import warnings

    import torch

    import passkit


    @passkit.graph_pass("noisy.warn")
    def warn(program):
        """Warn and log as torch does, in the middle of the table."""
        warnings.warn("a deprecation torch raised", FutureWarning)
        logging.getLogger("torch._dynamo").warning("a line torch logged")
        return False


    @passkit.hookimpl
    def passkit_register_passes():
        return [warn]


    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval(), (torch.randn(3, 8),)
    '''
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "noisy.py").write_text(NOISY)
    (tmp_path / "noisy.toml").write_text(
        '[pipeline]\nname = "noisy"\nextends = "export"\n\n[[steps]]\npass = "noisy.warn"\nafter = "functionalize"\n'
    )
    return tmp_path


def _piped(workdir: Path, *args: str) -> list[str]:
    """The command's lines as a pipe that holds stdout and stderr together shows them."""
    result = subprocess.run([sys.executable, "-m", "passkit", *args], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout
    return result.stdout.splitlines()


def _table(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith("pipeline "))
    end = next(i for i, line in enumerate(lines) if " steps ran, " in line)
    return lines[start:end + 1]


def test_export_prints_warnings_and_torch_logs_after_the_table(workdir: Path) -> None:
    lines = _piped(workdir, "export", "noisy.toml", "--model", "noisy:mlp", "-o", "m.pt2", "--plugin", "noisy")
    table = _table(lines)
    assert len(table) == 3 + 5 + 1, "\n".join(lines)  # title, names, rule; five rows; the summary
    assert all(line.startswith("[") for line in table[3:-1]), "\n".join(lines)
    after = lines[lines.index(table[-1]) + 1:]
    assert any("FutureWarning: a deprecation torch raised" in line for line in after), "\n".join(lines)
    assert any(line.endswith("a line torch logged") for line in after), "\n".join(lines)
    assert after[-1].startswith("ok: noisy on noisy:mlp: the exported program m.pt2 vs eager")


def test_a_piped_run_prints_dynamo_lines_before_the_table(workdir: Path) -> None:
    lines = _piped(workdir, "run", "training-python", "--model", "noisy:mlp")
    table = _table(lines)
    assert all(line.lstrip().startswith("[") for line in table[3:-1]), "\n".join(lines)
    before = lines[:lines.index(table[0])]
    assert any(line.startswith("Dynamo is tracing Sequential.forward") for line in before), "\n".join(lines)
    assert any(line.startswith("compiling graph 1: ") for line in before), "\n".join(lines)


def test_held_output_releases_in_order_after_holding_and_puts_everything_back(capsys) -> None:
    logger = logging.getLogger("torch._dynamo")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")

            def original(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
                sys.stderr.write(f"{category.__name__}: {message}\n")

            warnings.showwarning = original
            held = HeldOutput(holding=True)
            warnings.warn("first", FutureWarning)
            logger.warning("second")
            assert capsys.readouterr().err == ""
            held.release()
            err = capsys.readouterr().err
            assert err.index("FutureWarning: first") < err.index("second\n")
            logger.warning("dropped")
            held.drop()
            held.close()
            logger.warning("after")
            assert warnings.showwarning is original and not handler.filters
        assert capsys.readouterr().err.splitlines()[-1] == "after"
    finally:
        logger.removeHandler(handler)


def test_a_compile_cache_hit_prints_report_tables_table_with_no_step_times(workdir: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from passkit.cli import main

    monkeypatch.chdir(workdir)
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(workdir / "cache"))
    for command in (["run", "training-python"], ["export", "export", "-o", "m.pt2"]):
        cold = CliRunner().invoke(main, [*command, "--model", "noisy:mlp"])
        assert cold.exit_code == 0, cold.output
        warm = CliRunner().invoke(main, [*command, "--model", "noisy:mlp"])
        assert warm.exit_code == 0, warm.output
        lines = warm.stdout.splitlines()
        title = next(i for i, line in enumerate(lines) if line.startswith("pipeline "))
        assert lines[title].endswith("(graph 1, cache hit (folder): no step ran)"), warm.stdout
        rows = lines[title + 3:next(i for i, line in enumerate(lines) if line.startswith("loaded from the compile cache (folder) in "))]
        assert rows and all(row.split()[3:5] in (["yes", "-"], ["no", "-"]) for row in rows), warm.stdout
