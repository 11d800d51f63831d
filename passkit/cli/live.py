"""Own ``passkit run``'s live report: the step table printed row by row as the steps finish.

Each step prints exactly one line, numbered ``[i/N]`` like everywhere else (1-based), and that
line is the table's row, so nothing is printed twice. Column widths come from the pipeline's
step ids and pass names, known before the first step runs, so rows line up while streaming.
On a terminal a ``rich`` live status line shows what is running, its elapsed time ticking:
``Dynamo is tracing Block.forward at model.py:12 ... 2.1 s``, then ``[i/N] <id> ... 6.2 s,
14 kernels generated so far`` (the pass's phrase arrives with each heartbeat,
``passkit.core.progress``); each finished row prints above it. Piped output gets the finished rows,
and on stderr a plain line per progress event (Dynamo tracing a frame, a graph compiling or
recompiling, a step started or still running after a second), with no control codes. Several
graphs (graph breaks) each get a title, a header and a summary line. A graph loaded from the
compile cache gets ``Report.table()``'s table instead: its title says ``cache hit: no step ran``
and its rows show no step time.

Each graph's table stays whole. Python warnings and log records (torch's, Dynamo's) that arrive
while a table is open are held back and printed after its summary line
(``passkit.core.held_output``). Piped, the rows are also held until the summary (or until the
run stops), so the progress lines on stderr come before the table, never inside it. On a
terminal where stderr is the same terminal, whatever else is written to stderr while the status
line shows goes through the same console, above the status line, as a whole line between two
rows: it never lands inside a row or under the moving status line.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

import click
from rich.console import Console
from rich.live import Live
from rich.text import Text

from passkit.core.held_output import HeldOutput
from passkit.core.report import TABLE_HEADERS, format_row, summary_line

if TYPE_CHECKING:
    from passkit.core.progress import ProgressEvent
    from passkit.core.report import Report, StepRecord

__all__ = ["LiveTable"]

_RIGHT_ALIGNED = {0, 4}
_MIN_WIDTHS = (0, 0, 0, len("skipped"), len("99999.9 ms"), len("9999\u21929999"), 0)


class _RunningLine:
    """The live status line's text, rendered afresh at each refresh so the elapsed time ticks."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()
        self.detail = ""

    def __rich__(self) -> Text:
        detail = f", {self.detail}" if self.detail else ""
        return Text(f"{self.label} ... {time.perf_counter() - self.started:.1f} s{detail}", no_wrap=True, overflow="ellipsis")


class LiveTable:
    """A ``progress`` callable for ``run_check`` that prints the report table as it goes.

    ``console`` is where a terminal's output goes (by default a ``rich`` console on the stream);
    its ``event`` method takes ``passkit.core.progress`` events, from any thread.
    """

    def __init__(
        self, *, err: bool = False, interactive: bool | None = None, model: str = "", console: Console | None = None,
        stderr_through_console: bool | None = None,
    ) -> None:
        self.err = err
        self.model = model
        stream: TextIO = click.get_text_stream("stderr" if err else "stdout")
        self.interactive = stream.isatty() if interactive is None else interactive
        if stderr_through_console is None:  # the table on stdout, and stderr the same terminal
            stderr_through_console = self.interactive and not err and click.get_text_stream("stderr").isatty()
        self.stderr_through_console = stderr_through_console
        self.console = console or (Console(file=stream, force_terminal=True, highlight=False) if self.interactive else None)
        self.live: Live | None = None
        self.running: _RunningLine | None = None
        self._lock = threading.RLock()  # events arrive from the progress thread
        self.name = ""
        self.steps: list[tuple[str, str]] = []
        self.widths: list[int] = [len(h) for h in TABLE_HEADERS]
        self.graphs = 0
        self.open = False
        self.held: HeldOutput | None = None  # warnings and logs, from ``begin`` to ``close``
        self.pending: list[str] = []  # piped: the open table's lines, printed at its summary
        self.header: list[str] = []  # the open table's header, until its first row
        self.hit = False  # the open table is a compile-cache hit's

    def begin(self, pipeline: Any) -> None:
        """Learn the plan (``pipeline.name`` and each step's ``id`` and ``pass_name``) and print
        the first table's header, before anything is compiled (capture takes seconds)."""
        self.name = pipeline.name
        if self.held is None:
            self.held = HeldOutput()
        if self.model:
            click.echo(f"passkit run: compiling {self.model} with {pipeline.name} ({len(pipeline.steps)} steps) ...", err=True)
        self.steps = [(step.id, step.pass_name) for step in pipeline.steps]
        total = len(self.steps)
        number = len(f"[{total}/{total}]")
        cells = (number, max((len(i) for i, _ in self.steps), default=0), max((len(p) for _, p in self.steps), default=0))
        self.widths = [max(len(h), m, c) for h, m, c in zip(TABLE_HEADERS, _MIN_WIDTHS, (*cells, 0, 0, 0, 0))]
        if self.interactive:  # the table opens under the graph's "compiling" line
            self._show_status("capturing the model with Dynamo")
        else:
            self._start_graph()

    def __call__(self, record: StepRecord) -> None:
        with self._lock:
            if not self.open:
                self._start_graph()
            self._print_header()
            cells = list(format_row(record))
            cells[0] = self._number(record.position)
            self._echo(self._line(cells))
            if record.position + 1 < len(self.steps):
                self._show_running(record.position + 1)
            else:
                self._stop_live()

    def event(self, event: ProgressEvent) -> None:
        """A progress event: on a terminal, the status line's phrase (or a line above it for a
        graph compiling); piped, one plain line on stderr."""
        with self._lock:
            if not self.interactive:
                click.echo(event.text, err=True)
                return
            if event.kind == "tracing":
                self._show_status(event.text)
            elif event.kind in ("compiling", "recompiling"):
                self._echo(event.text)
                if not self.open:
                    self._start_graph(running=f"capturing {event.graph}")
            elif event.position >= 0:  # the step's own clock and phrase
                self._show_running(event.position)
                if self.running is not None:
                    self.running.started = time.perf_counter() - event.seconds
                    self.running.detail = event.detail

    def loaded_from_cache(self, report: Report) -> None:
        """A compile-cache hit: no step ran, so the graph's table is ``Report.table()``'s, which
        says so in its title and shows no step times (``finished`` then only closes it)."""
        with self._lock:
            if not self.open:
                self._start_graph()
            self.header, self.hit = [], True
            shown = dataclasses.replace(report, graph=f"graph {self.graphs}", verdict=None)
            for line in shown.table().splitlines():
                self._echo(line)
            self._stop_live()

    def finished(self, report: Report) -> None:
        """Close the current graph's table with its summary line (called once per graph)."""
        with self._lock:
            if not self.hit:
                self._print_header()
                self._echo(summary_line(report))
            self._echo("")
            self._end_graph()
            self._stop_live()

    def _end_graph(self) -> None:
        """The table is whole: print it if it was held (piped), then what was held meanwhile."""
        self.open, self.hit, self.header = False, False, []  # a header with no row under it: no table
        pending, self.pending = self.pending, []
        for line in pending:
            self._echo(line)
        if self.held is not None:
            self.held.holding = False
            self.held.release()

    def _start_graph(self, running: str = "") -> None:
        self.graphs += 1
        self.open = True
        if self.held is not None:
            self.held.holding = True
        # Printed with the first row: a compile-cache hit prints Report.table()'s instead.
        self.header = [f"pipeline {self.name} (graph {self.graphs})" if self.name else f"graph {self.graphs}",
                       self._line(list(TABLE_HEADERS)), self._line(["-" * w for w in self.widths])]
        if running:
            self._show_status(running)
        elif self.steps:
            self._show_running(0)

    def _print_header(self) -> None:
        header, self.header = self.header, []
        for line in header:
            self._echo(line)

    def _number(self, position: int) -> str:
        return f"[{position + 1}/{len(self.steps) or '?'}]"

    def _line(self, cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            width = self.widths[i] if i < len(self.widths) else 0
            out.append(cell.rjust(width) if i in _RIGHT_ALIGNED else cell.ljust(width))
        return "  ".join(out).rstrip()

    def _show_running(self, position: int) -> None:
        if position < len(self.steps):
            self._show_status(f"{self._number(position).rjust(self.widths[0])}  {self.steps[position][0]}")

    def _show_status(self, label: str) -> None:
        if self.console is None or (self.running is not None and self.running.label == label):
            return
        self.running = _RunningLine(label)
        if self.live is None:
            self.live = Live(self.running, console=self.console, transient=True, refresh_per_second=4,
                             redirect_stdout=False, redirect_stderr=self.stderr_through_console)
            self.live.start()
        else:
            self.live.update(self.running, refresh=True)

    def close(self) -> None:
        """Take the status line down (a run that failed or fell back never finishes its graph)."""
        with self._lock:
            self._stop_live()
            self._end_graph()
            if self.held is not None:
                self.held.close()
                self.held = None

    def _stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live, self.running = None, None

    def _echo(self, text: str) -> None:
        if self.open and self.console is None:
            self.pending.append(text)
        elif self.console is not None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
        else:
            click.echo(text, err=self.err)
