"""Own ``passkit run``'s live report: the step table printed row by row as the steps finish.

Each step prints exactly one line, numbered ``[i/N]`` like everywhere else (1-based), and that
line is the table's row, so nothing is printed twice. Column widths come from the pipeline's
step ids and pass names, known before the first step runs, so rows line up while streaming.
On a terminal the step that is running shows as a transient ``[i/N] <id> ...`` line that its
row then replaces; piped output gets only the finished rows (plain text, no control codes).
Several graphs (graph breaks) each get a title, a header and a summary line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

import click

from passkit.report import TABLE_HEADERS, format_row, summary_line

if TYPE_CHECKING:
    from passkit.report import Report, StepRecord

__all__ = ["LiveTable"]

_RIGHT_ALIGNED = {0, 4}
_MIN_WIDTHS = (0, 0, 0, len("skipped"), len("99999.9 ms"), len("9999\u21929999"), 0)


class LiveTable:
    """A ``progress`` callable for ``run_check`` that prints the report table as it goes."""

    def __init__(self, *, err: bool = False, interactive: bool | None = None, model: str = "") -> None:
        self.err = err
        self.model = model
        stream: TextIO = click.get_text_stream("stderr" if err else "stdout")
        self.interactive = stream.isatty() if interactive is None else interactive
        self.name = ""
        self.steps: list[tuple[str, str]] = []
        self.widths: list[int] = [len(h) for h in TABLE_HEADERS]
        self.graphs = 0
        self.open = False
        self.transient = False

    def begin(self, pipeline: Any) -> None:
        """Learn the plan (``pipeline.name`` and each step's ``id`` and ``pass_name``) and print
        the first table's header, before anything is compiled (capture takes seconds)."""
        self.name = pipeline.name
        if self.model:
            click.echo(f"passkit run: compiling {self.model} with {pipeline.name} ({len(pipeline.steps)} steps) ...", err=True)
        self.steps = [(step.id, step.pass_name) for step in pipeline.steps]
        total = len(self.steps)
        number = len(f"[{total}/{total}]")
        cells = (number, max((len(i) for i, _ in self.steps), default=0), max((len(p) for _, p in self.steps), default=0))
        self.widths = [max(len(h), m, c) for h, m, c in zip(TABLE_HEADERS, _MIN_WIDTHS, (*cells, 0, 0, 0, 0))]
        self._start_graph()

    def __call__(self, record: StepRecord) -> None:
        if not self.open:
            self._start_graph()
        cells = list(format_row(record))
        cells[0] = self._number(record.position)
        self._clear_transient()
        self._echo(self._line(cells))
        if record.position + 1 < len(self.steps):
            self._show_running(record.position + 1)

    def finished(self, report: Report) -> None:
        """Close the current graph's table with its summary line (called once per graph)."""
        self._clear_transient()
        self._echo(summary_line(report))
        self._echo("")
        self.open = False

    def _start_graph(self) -> None:
        self.graphs += 1
        self.open = True
        self._echo(f"pipeline {self.name} (graph {self.graphs})" if self.name else f"graph {self.graphs}")
        self._echo(self._line(list(TABLE_HEADERS)))
        self._echo(self._line(["-" * w for w in self.widths]))
        if self.steps:
            self._show_running(0)

    def _number(self, position: int) -> str:
        return f"[{position + 1}/{len(self.steps) or '?'}]"

    def _line(self, cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            width = self.widths[i] if i < len(self.widths) else 0
            out.append(cell.rjust(width) if i in _RIGHT_ALIGNED else cell.ljust(width))
        return "  ".join(out).rstrip()

    def _show_running(self, position: int) -> None:
        if not self.interactive or position >= len(self.steps):
            return
        step_id = self.steps[position][0]
        click.echo(f"{self._number(position).rjust(self.widths[0])}  {step_id} ...", nl=False, err=self.err)
        self.transient = True

    def _clear_transient(self) -> None:
        if self.transient:
            click.echo("\r\x1b[K", nl=False, err=self.err)
            self.transient = False

    def _echo(self, text: str) -> None:
        click.echo(text, err=self.err)
