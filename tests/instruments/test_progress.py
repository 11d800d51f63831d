"""A step that runs over the threshold says it started, then beats with its elapsed time and the
pass's own phrase; a quick step says nothing; callbacks that take events get them as data.

The thresholds are lowered (``passkit.core.progress``'s module constants) so the sleeps stay short.
Elapsed times depend on the machine's load, so the lines are matched whole with the figure as
a pattern.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from passkit.core import progress

from passkit.core import runner
from passkit.core.hookspecs import hookimpl
from passkit.instruments import progress as progress_instrument
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program
from passkit.core.report import StepRecord

from tiny_programs import Kit, make_program

SECONDS = r"\d+\.\d s"


@graph_pass("test.dawdle")
def dawdle(program: Program) -> bool:
    """Sleep past the lowered thresholds, saying how far it got."""
    done = [0]
    with progress.detail(lambda: f"{done[0]} of 3 chunks done"):
        for _ in range(3):
            time.sleep(0.15)
            done[0] += 1
    return False


@graph_pass("test.quick")
def quick(program: Program) -> bool:
    """Return at once."""
    return False


class SlowPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [dawdle, quick]


@pytest.fixture
def kit(monkeypatch: pytest.MonkeyPatch) -> Kit:
    monkeypatch.setattr(progress, "STARTED_AFTER_S", 0.05)
    monkeypatch.setattr(progress, "HEARTBEAT_EVERY_S", 0.1)
    kit = Kit(SlowPasses())
    kit.pm.register(progress_instrument, name="progress")
    return kit


def _run(kit: Kit, callback: object = None) -> None:
    pipeline = kit.pipeline("test.quick", "test.dawdle")
    runner.run_pipeline(pipeline, make_program(), pm=kit.pm, registry=kit.registry, progress=callback)  # type: ignore[arg-type]


def test_a_long_step_logs_started_then_heartbeats_with_the_pass_phrase(kit: Kit, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="passkit"):
        _run(kit)
    lines = [r.getMessage() for r in caplog.records if r.name == "passkit"]
    assert re.fullmatch(rf"\[2/2\] test\.dawdle: started, running for {SECONDS}", lines[0]), lines
    beats = lines[1:]
    assert beats, lines
    for line in beats:
        assert re.fullmatch(rf"\[2/2\] test\.dawdle: still running, {SECONDS}, [0-3] of 3 chunks done", line), lines
    assert not any("test.quick" in line for line in lines)  # a quick step stays silent


def test_no_event_follows_the_end_of_the_step(kit: Kit, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="passkit"):
        _run(kit)
        count = len(caplog.records)
        time.sleep(0.3)  # two heartbeat periods: a watch left running would log again
    assert len(caplog.records) == count


def test_every_watch_thread_has_ended_when_the_run_returns(kit: Kit) -> None:
    # A watch thread that outlived its step freed the step's tensors while the interpreter
    # exited, and the process aborted ("terminate called without an active exception").
    _run(kit)
    assert [thread.name for thread in threading.enumerate() if thread.name.startswith("passkit-progress")] == []


def test_the_timer_holds_no_watch_once_the_run_returns(kit: Kit) -> None:
    # One timer thread times every step of the process; each step takes its watch back before
    # it returns, so that thread holds nothing of a finished step (see the test above).
    _run(kit)
    assert progress_instrument._timer._watches == []


def test_a_callback_with_an_event_method_gets_events_and_records(kit: Kit, caplog: pytest.LogCaptureFixture) -> None:
    class Callback:
        def __init__(self) -> None:
            self.seen: list[object] = []

        def __call__(self, record: StepRecord) -> None:
            self.seen.append(record)

        def event(self, event: progress.ProgressEvent) -> None:
            self.seen.append(event)

    callback = Callback()
    with caplog.at_level(logging.INFO, logger="passkit"):
        _run(kit, callback)
    kinds = [getattr(item, "kind", None) or f"record {item.id}" for item in callback.seen]  # type: ignore[attr-defined]
    assert kinds[0] == "record test.quick" and kinds[1] == "started" and kinds[-1] == "record test.dawdle"
    assert set(kinds[2:-1]) == {"heartbeat"}
    started = callback.seen[1]
    assert isinstance(started, progress.ProgressEvent)
    assert (started.step_id, started.pass_name, started.position, started.total) == ("test.dawdle", "test.dawdle", 1, 2)
    assert started.seconds >= 0.05
    assert callback.seen[-2].detail.endswith("of 3 chunks done")  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.name == "passkit"]  # the callback took them all


def test_a_callback_of_records_only_gets_records_and_no_event_is_logged(kit: Kit, caplog: pytest.LogCaptureFixture) -> None:
    records: list[StepRecord] = []
    with caplog.at_level(logging.INFO, logger="passkit"):
        _run(kit, records.append)
    assert [r.id for r in records] == ["test.quick", "test.dawdle"]
    assert [r.getMessage() for r in caplog.records if r.name == "passkit"] == []  # the callback replaces the log


def test_a_phrase_lasts_its_block_and_a_failing_one_is_left_out() -> None:
    step = progress.RunningStep()
    with progress.running_step(step):
        with progress.detail(lambda: "2 of 3 chunks done"):
            assert step.detail() == "2 of 3 chunks done"
        assert step.detail() == ""
        with progress.detail(lambda: str(1 / 0)):
            assert step.detail() == ""
