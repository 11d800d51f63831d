"""Report rendering: the table `passkit run` prints and the JSON scripts read."""

from __future__ import annotations

import json

from passkit.core.report import Report, StepRecord, ValueDiff, Verdict, format_bytes, format_stats


def _report() -> Report:
    return Report(
        pipeline="training",
        seconds=0.0125,
        records=[
            StepRecord(0, "functionalize", "functionalize", changed=True, claimed_changed=True,
                       seconds=0.0031, nodes_before=12, nodes_after=10),
            StepRecord(1, "joint", "joint", status="skipped", reason="inference program"),
            StepRecord(2, "partition", "partition.default", changed=True, claimed_changed=True, seconds=0.002,
                       nodes_before=30, nodes_after=34, stats={"saved": 3, "saved_bytes": 12288},
                       dumps=["d/03-partition-forward.py", "d/03-partition-backward.py"]),
            StepRecord(3, "fx.dce", "fx.dce", changed=False, claimed_changed=True, seconds=0.0004,
                       nodes_before=34, nodes_after=34),
        ],
    )


def test_table_has_one_aligned_row_per_step() -> None:
    assert _report().table() == "\n".join([
        "pipeline training",
        "#  step           pass               changed    time  nodes  notes",
        "-  -------------  -----------------  -------  ------  -----  ---------------------------",
        "1  functionalize  functionalize      yes      3.1 ms  12\u219210",
        "2  joint          joint              skipped       -  -      inference program",
        "3  partition      partition.default  yes      2.0 ms  30\u219234  saved=3 (12.0 KiB), dumps=2",
        "4  fx.dce         fx.dce             no       0.4 ms  34\u219234  claimed a change",
        "3 of 4 steps ran, 2 changed the graphs, 12.5 ms in total",
    ])


def test_table_title_names_the_graph_when_a_run_has_several() -> None:
    report = Report(pipeline="inference", records=[], graph="graph 2 of 3")
    assert report.table().splitlines()[0] == "pipeline inference (graph 2 of 3)"
    assert report.table().splitlines()[-1] == "0 of 0 steps ran, 0 changed the graphs, 0.0 ms in total"


def test_pass_that_claims_no_change_but_changed_is_noted() -> None:
    record = StepRecord(0, "x", "x", changed=True, claimed_changed=False)
    assert record.remarks() == "claimed no change"


def test_to_json_is_plain_data_that_round_trips() -> None:
    report = _report()
    report.records[3].stats = {"ratio": 0.5, "shape": (2, 3), "odd": object, "inf": float("inf")}
    data = json.loads(json.dumps(report.to_json()))
    assert data["pipeline"] == "training"
    assert data["seconds"] == 0.0125
    assert [s["id"] for s in data["steps"]] == ["functionalize", "joint", "partition", "fx.dce"]
    assert data["steps"][1] == {
        "position": 1, "id": "joint", "pass_name": "joint", "status": "skipped",
        "reason": "inference program", "changed": False, "claimed_changed": None, "seconds": 0.0,
        "nodes_before": 0, "nodes_after": 0, "dumps": [], "repro": "", "stats": {}, "number": 2,
    }
    assert data["steps"][2]["dumps"] == ["d/03-partition-forward.py", "d/03-partition-backward.py"]
    assert data["steps"][3]["stats"] == {"ratio": 0.5, "shape": [2, 3], "odd": "<class 'object'>", "inf": "inf"}


def test_format_bytes_picks_a_readable_unit() -> None:
    assert [format_bytes(n) for n in (0, 512, 1536, 3 * 1024**2 + 512 * 1024, 5 * 1024**4)] == [
        "0 B", "512 B", "1.5 KiB", "3.5 MiB", "5120.0 GiB",
    ]


def test_format_stats_pairs_counts_with_their_sizes() -> None:
    stats = {"saved": 3, "saved_bytes": 12288, "workspace_bytes": 2048, "ratio": 0.123456, "ops": ["a", "b"]}
    assert format_stats(stats) == "saved=3 (12.0 KiB), workspace=2.0 KiB, ratio=0.123, ops=[a, b]"


def test_table_ends_with_the_runs_verdict_per_output_and_gradient() -> None:
    report = _report()
    report.verdict = Verdict(
        "mismatch", 1, 1e-3, 1e-4,
        [ValueDiff("output[0]", 3.1e-4, ok=False), ValueDiff("grad[fc.weight]", 2.5e-5)],
        "first mismatch: output[0]: max |diff| 0.000311",
    )
    assert report.table().splitlines()[-5:] == [
        "3 of 4 steps ran, 2 changed the graphs, 12.5 ms in total",
        "verdict: MISMATCH vs eager (rtol 0.001, atol 0.0001), exit code 1",
        "  output[0]        max |diff| 3.1e-04  MISMATCH",
        "  grad[fc.weight]  max |diff| 2.5e-05",
        "  first mismatch: output[0]: max |diff| 0.000311",
    ]
    assert json.loads(json.dumps(report.to_json()))["verdict"] == {
        "outcome": "mismatch", "exit_code": 1, "rtol": 1e-3, "atol": 1e-4,
        "values": [{"label": "output[0]", "max_diff": 3.1e-4, "ok": False},
                   {"label": "grad[fc.weight]", "max_diff": 2.5e-5, "ok": True}],
        "detail": "first mismatch: output[0]: max |diff| 0.000311",
    }


def test_a_verdict_without_a_comparison_names_the_outcome_and_exit_code() -> None:
    verdict = Verdict("step failed", 4, detail="t.toml: steps[0] (x) failed: RuntimeError: boom (first step)")
    assert verdict.lines() == [
        "verdict: STEP FAILED, exit code 4",
        "  t.toml: steps[0] (x) failed: RuntimeError: boom (first step)",
    ]
    assert Verdict("ok", 0, 1e-4, 1e-5).lines() == ["verdict: ok vs eager (rtol 0.0001, atol 1e-05), exit code 0"]
