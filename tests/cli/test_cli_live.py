"""``passkit run``'s live table: one ``[i/N]`` row per step; on a terminal a rich status line for what runs,
piped plain progress lines on stderr."""

from __future__ import annotations

import io
import re
import types

from click.testing import CliRunner
from rich.console import Console

from passkit.cli.live import LiveTable
from passkit.core.progress import ProgressEvent
from passkit.core.report import Report, StepRecord

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


def _drive_terminal() -> str:
    """A terminal run (a rich console writing into a buffer): the compile line, one step's
    row, a heartbeat of the next step, its row, the summary."""
    buffer = io.StringIO()
    live = LiveTable(interactive=True, console=Console(file=buffer, force_terminal=True, width=120))
    live.begin(PLAN)
    live.event(ProgressEvent(kind="tracing", text=TRACING))
    live.event(ProgressEvent(kind="compiling", text=COMPILING, graph="graph 1"))
    live(RECORDS[0])
    live.event(ProgressEvent(kind="heartbeat", text="", step_id="codegen.python", position=1, total=2, seconds=6.0,
                             detail="3 kernels generated so far"))
    live(RECORDS[1])
    live.finished(Report("p", list(RECORDS), seconds=0.004))
    return buffer.getvalue()


TRACING = "Dynamo is tracing f at m.py:1 (Dynamo frame 0/0)"
COMPILING = "compiling graph 1: f at m.py:1 (Dynamo frame 0/0), inputs x float32[2]"
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TOKENS = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+")


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows once ``raw`` is written: carriage returns, erase-line and
    cursor-up codes applied (the codes rich's live display uses), other codes ignored."""
    lines, row, col = [""], 0, 0
    for token in _TOKENS.findall(raw):
        if token == "\n":
            row, col = row + 1, 0
            lines.extend([""] * (row + 1 - len(lines)))
        elif token == "\r":
            col = 0
        elif token == "\x1b[2K":
            lines[row] = ""
        elif token == "\x1b[1A":
            row = max(0, row - 1)
        elif not token.startswith("\x1b"):
            lines[row] = lines[row][:col] + token + lines[row][col + len(token):]
            col += len(token)
    while len(lines) > 1 and lines[-1] == "" and lines[-2] == "":
        lines.pop()
    return lines


def test_a_terminal_shows_a_live_status_line_and_the_rows_above_it() -> None:
    raw = _drive_terminal()
    assert _screen(raw) == [
        COMPILING,
        "pipeline p (graph 1)",
        "    #  step            pass            changed        time  nodes      notes",
        "-----  --------------  --------------  -------  ----------  ---------  -----",
        "[1/2]  functionalize   functionalize   yes          1.0 ms  3\u21924",
        "[2/2]  codegen.python  codegen.python  no           2.0 ms  4\u21924",
        "2 of 2 steps ran, 1 changed the graphs, 4.0 ms in total",
        "",
    ]
    # The status line said what ran, with the elapsed time and the pass's phrase...
    assert f"{TRACING} ... 0.0 s\r" in raw  # a status, not a line of its own (see the screen above)
    assert "\n[2/2]  codegen.python ... 6.0 s, 3 kernels generated so far\r" in raw


def test_each_graph_gets_its_own_title_and_summary() -> None:
    text = _drive(interactive=False, graphs=2)
    titles = [line for line in text.splitlines() if line.startswith("pipeline p")]
    assert titles == ["pipeline p (graph 1)", "pipeline p (graph 2)"]
    assert text.count("2 of 2 steps ran, 1 changed the graphs, 4.0 ms in total") == 2


def test_piped_progress_events_are_plain_lines_on_stderr_and_leave_the_table_alone() -> None:
    runner = CliRunner()
    with runner.isolation() as (out, err, *_):
        live = LiveTable(interactive=False)
        live.begin(PLAN)
        live.event(ProgressEvent(kind="tracing", text=TRACING))
        live.event(ProgressEvent(kind="compiling", text=COMPILING, graph="graph 1"))
        live(RECORDS[0])
        live.event(ProgressEvent(kind="started", text="[2/2] codegen.python: started, running for 1.0 s",
                                 step_id="codegen.python", position=1, total=2, seconds=1.0))
        live(RECORDS[1])
        live.finished(Report("p", list(RECORDS), seconds=0.004))
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    assert stderr == f"{TRACING}\n{COMPILING}\n[2/2] codegen.python: started, running for 1.0 s\n"
    assert "\x1b" not in stdout + stderr
    assert stdout.splitlines()[3:5] == [
        "[1/2]  functionalize   functionalize   yes          1.0 ms  3\u21924",
        "[2/2]  codegen.python  codegen.python  no           2.0 ms  4\u21924",
    ]


def test_on_a_terminal_stderr_lines_print_above_the_status_line_between_rows(capsys) -> None:
    import sys

    buffer = io.StringIO()
    live = LiveTable(interactive=True, console=Console(file=buffer, force_terminal=True, width=120),
                     stderr_through_console=True)
    live.begin(PLAN)
    live.event(ProgressEvent(kind="compiling", text=COMPILING, graph="graph 1"))
    live(RECORDS[0])
    sys.stderr.write("a line a library wrote on stderr\n")  # while the status line shows step 2
    print("model.py:7: UserWarning: careful", file=sys.stderr)  # as warnings.showwarning writes
    live(RECORDS[1])
    live.finished(Report("p", list(RECORDS), seconds=0.004))
    screen = _screen(buffer.getvalue())
    assert screen[4:8] == [
        "[1/2]  functionalize   functionalize   yes          1.0 ms  3\u21924",
        "a line a library wrote on stderr",
        "model.py:7: UserWarning: careful",
        "[2/2]  codegen.python  codegen.python  no           2.0 ms  4\u21924",
    ]
    assert capsys.readouterr().err == ""  # nothing reached the terminal around the console
