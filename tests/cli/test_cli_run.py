"""`passkit run`: progress, report tables, the verdict line, JSON output and exit codes.

``passkit.frontends.check.run_check`` is replaced by a fake so these tests exercise only the command's
formatting and exit codes, not compilation.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from passkit.cli import main
from passkit.core.report import Report, StepRecord


@dataclass
class FakeCheckResult:
    pipeline: str = "good"
    model: str = "passkit.examples:block"
    training: bool = True
    reports: list[Report] = field(default_factory=list)
    outputs_max_diff: float = 1.25e-7
    grads_max_diff: float | None = 3.5e-7
    ok: bool = True
    buffers_max_diff: float | None = None
    mismatches: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "ok": self.ok, "reports": [r.to_json() for r in self.reports]}


RECORDS = [
    StepRecord(0, "functionalize", "functionalize", changed=True, claimed_changed=True, seconds=0.002,
               nodes_before=10, nodes_after=9),
    StepRecord(1, "joint", "joint", status="skipped", reason="inference program"),
]


PLAN = types.SimpleNamespace(name="good", steps=[
    types.SimpleNamespace(id="functionalize", pass_name="functionalize"),
    types.SimpleNamespace(id="joint", pass_name="joint"),
])


class FakeCheck:
    """Stands in for ``passkit.frontends.check``: records its arguments, reports progress, returns a result."""

    def __init__(self, result: FakeCheckResult | None = None, error: BaseException | None = None) -> None:
        self.result = result or FakeCheckResult(reports=[Report("good", list(RECORDS), seconds=0.003)])
        self.error = error
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run_check(self, pipeline: str, *, model: str | None = None, dump_dir: str | None = None,
                  progress: Callable[[StepRecord], None] | None = None, **tolerance: float) -> FakeCheckResult:
        self.calls.append((pipeline, {"model": model, "dump_dir": dump_dir, **tolerance}))
        if self.error is not None:
            raise self.error
        progress.begin(PLAN)
        for record in RECORDS:
            progress(record)
        for report in self.result.reports:
            progress.finished(report)
        return self.result


@pytest.fixture
def fake_check(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeCheck]:
    def install(**kwargs: Any) -> FakeCheck:
        fake = FakeCheck(**kwargs)
        module = types.ModuleType("passkit.frontends.check")
        module.run_check = fake.run_check
        monkeypatch.setitem(sys.modules, "passkit.frontends.check", module)
        monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
        return fake

    return install


TABLE = (
    "pipeline good (graph 1)\n"
    "    #  step           pass           changed        time  nodes      notes\n"
    "-----  -------------  -------------  -------  ----------  ---------  -----\n"
    "[1/2]  functionalize  functionalize  yes          2.0 ms  10\u21929\n"
    "[2/2]  joint          joint          skipped           -  -          inference program\n"
    "1 of 2 steps ran, 1 changed the graphs, 3.0 ms in total\n"
)


def test_run_prints_one_numbered_row_per_step_as_it_goes_and_the_verdict(cli, fake_check) -> None:
    fake = fake_check()
    result = cli.invoke(main, ["run", "good.toml", "--model", "pkg.mod:make", "--dump", "out"])
    assert result.exit_code == 0
    assert fake.calls == [("good.toml", {"model": "pkg.mod:make", "dump_dir": "out"})]
    # Progress from the first second, on stderr; each step is printed once, as its table row.
    assert result.stderr == "passkit run: compiling pkg.mod:make with good (2 steps) ...\n"
    assert result.stdout == TABLE + "\n" + (
        "ok: good on passkit.examples:block (training) vs eager: "
        "outputs max |diff| 1.2e-07, grads max |diff| 3.5e-07 (rtol 0.0001, atol 1e-05)\n"
    )


def test_run_exits_1_on_a_numeric_mismatch(cli, fake_check) -> None:
    fake_check(result=FakeCheckResult(ok=False, training=False, outputs_max_diff=0.03, grads_max_diff=None))
    result = cli.invoke(main, ["run", "good.toml"])
    assert result.exit_code == 1
    # The rows streamed as the steps ran; the verdict is the last line.
    assert result.stdout.splitlines()[-1] == (
        "MISMATCH: good on passkit.examples:block (inference) vs eager: "
        "outputs max |diff| 3.0e-02, grads max |diff| n/a (rtol 0.0001, atol 1e-05)"
    )


def test_run_verdict_names_the_first_mismatch_and_buffers(cli, fake_check) -> None:
    fake_check(result=FakeCheckResult(
        ok=False, outputs_max_diff=0.5, grads_max_diff=2e-3, buffers_max_diff=0.0,
        mismatches=["output[0]: max |diff| 5.0e-01", "grad[fc.weight]: max |diff| 2.0e-03"],
    ))
    result = cli.invoke(main, ["run", "good.toml"])
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == (
        "MISMATCH: good on passkit.examples:block (training) vs eager: outputs max |diff| 5.0e-01, "
        "grads max |diff| 2.0e-03, buffers max |diff| 0.0e+00 (rtol 0.0001, atol 1e-05); first mismatch: output[0]: max |diff| 5.0e-01 "
        "(+1 more)"
    )


def test_run_json_to_a_file_keeps_the_text_output(cli, fake_check, tmp_path) -> None:
    fake_check()
    out = tmp_path / "result.json"
    result = cli.invoke(main, ["run", "good.toml", "--json", str(out)])
    assert result.exit_code == 0
    assert result.stdout.startswith(TABLE)
    data = json.loads(out.read_text())
    assert data["ok"] is True
    assert [step["id"] for step in data["reports"][0]["steps"]] == ["functionalize", "joint"]


def test_run_json_to_stdout_prints_only_json_there(cli, fake_check) -> None:
    fake_check()
    result = cli.invoke(main, ["run", "good.toml", "--json", "-"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["pipeline"] == "good"
    assert result.stderr.splitlines()[-1].startswith("ok: good on passkit.examples:block (training)")


@pytest.mark.parametrize(
    "args",
    [
        ["run", "good.toml", "--json"],
        ["run", "--json", "good.toml"],
        ["run", "good.toml", "--json", "--model", "pkg.mod:make"],
    ],
    ids=["after-file", "before-file", "before-another-option"],
)
def test_run_json_is_a_bare_flag_like_the_listings(cli, fake_check, args) -> None:
    fake = fake_check()
    result = cli.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert [call[0] for call in fake.calls] == ["good.toml"]
    assert json.loads(result.stdout) == {
        "pipeline": "good", "ok": True, "reports": [report.to_json() for report in fake.result.reports],
    }
    assert result.stderr.splitlines()[-1] == (
        "ok: good on passkit.examples:block (training) vs eager: "
        "outputs max |diff| 1.2e-07, grads max |diff| 3.5e-07 (rtol 0.0001, atol 1e-05)"
    )


def test_run_without_a_file_is_still_a_missing_argument(cli, fake_check) -> None:
    fake = fake_check()
    for args in (["run"], ["run", "--json"], ["run", "--json", "-"]):
        result = cli.invoke(main, args)
        assert (result.exit_code, result.stderr) == (2, "passkit run: Missing argument 'FILE' (see 'passkit run --help')\n")
    assert fake.calls == []


def test_run_exits_3_and_says_so_when_the_compile_fell_back_to_eager(cli, fake_check) -> None:
    fake_check(result=FakeCheckResult(outputs_max_diff=0.0, grads_max_diff=0.0,
                                      fallbacks=["t.toml: steps[1] (fold) failed: RuntimeError: kaboom (after: functionalize)"]))
    result = cli.invoke(main, ["run", "good.toml"])
    assert result.exit_code == 3
    assert result.stdout.splitlines()[-1] == (
        "FELL BACK TO EAGER: good on passkit.examples:block (training): nothing was compiled, so eager was "
        "compared with itself; the compile failed: t.toml: steps[1] (fold) failed: RuntimeError: kaboom "
        "(after: functionalize)"
    )


def test_run_passes_rtol_and_atol_through(cli, fake_check) -> None:
    fake = fake_check()
    result = cli.invoke(main, ["run", "good.toml", "--rtol", "1e-3", "--atol", "0.01"])
    assert result.exit_code == 0
    assert fake.calls == [("good.toml", {"model": None, "dump_dir": None, "rtol": 1e-3, "atol": 0.01})]


def test_run_rejects_a_negative_tolerance_with_exit_2(cli, fake_check) -> None:
    fake = fake_check()
    result = cli.invoke(main, ["run", "good.toml", "--atol", "-1"])
    assert result.exit_code == 2
    assert fake.calls == []
    assert result.stderr == (
        "passkit run: Invalid value for '--atol': -1.0 is not in the range x>=0 (see 'passkit run --help')\n"
    )
