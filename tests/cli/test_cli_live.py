"""``passkit run``'s live table: one ``[i/N]`` row per step, a transient line only on a terminal."""

from __future__ import annotations

import types

from click.testing import CliRunner

from passkit.cli.live import LiveTable
from passkit.report import Report, StepRecord

PLAN = types.SimpleNamespace(name="p", steps=[
    types.SimpleNamespace(id="functionalize", pass_name="functionalize"),
    types.SimpleNamespace(id="codegen.python", pass_name="codegen.python"),
])
RECORDS = [
    StepRecord(0, "functionalize", "functionalize", changed=True, seconds=0.001, nodes_before=3, nodes_after=4),
    StepRecord(1, "codegen.python", "codegen.python", seconds=0.002, nodes_before=4, nodes_after=4),
]


def _drive(interactive: bool, graphs: int = 1) -> str:
    runner = CliRunner()
    with runner.isolation() as (out, _err, *_):
        live = LiveTable(interactive=interactive)
        live.begin(PLAN)
        for _ in range(graphs):
            for record in RECORDS:
                live(record)
            live.finished(Report("p", list(RECORDS), seconds=0.004))
        return out.getvalue().decode()


def test_piped_output_is_plain_rows_numbered_from_one() -> None:
    assert _drive(interactive=False) == (
        "pipeline p (graph 1)\n"
        "    #  step            pass            changed        time  nodes      notes\n"
        "-----  --------------  --------------  -------  ----------  ---------  -----\n"
        "[1/2]  functionalize   functionalize   yes          1.0 ms  3\u21924\n"
        "[2/2]  codegen.python  codegen.python  no           2.0 ms  4\u21924\n"
        "2 of 2 steps ran, 1 changed the graphs, 4.0 ms in total\n"
        "\n"
    )


def test_a_terminal_shows_the_running_step_and_replaces_it_with_its_row() -> None:
    # (click drops the erase-line code when the stream is not a real terminal; the \r stays.)
    lines = _drive(interactive=True).split("\n")
    assert lines[3] == "[1/2]  functionalize ...\r[1/2]  functionalize   functionalize   yes          1.0 ms  3\u21924"
    assert lines[4] == "[2/2]  codegen.python ...\r[2/2]  codegen.python  codegen.python  no           2.0 ms  4\u21924"


def test_each_graph_gets_its_own_title_and_summary() -> None:
    text = _drive(interactive=False, graphs=2)
    titles = [line for line in text.splitlines() if line.startswith("pipeline p")]
    assert titles == ["pipeline p (graph 1)", "pipeline p (graph 2)"]
    assert text.count("2 of 2 steps ran, 1 changed the graphs, 4.0 ms in total") == 2
