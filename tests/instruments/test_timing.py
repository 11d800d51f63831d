"""The timing instrument fills record.seconds with the pass's own time.

Wall-clock bounds flake on a loaded machine, so the figures are checked on a fake clock that
only the test moves: exact values, whatever else the machine is doing. One test keeps the real
clock, with a lower bound only (a sleep never takes less than it asked for).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Generator

import pytest

from passkit.core.hookspecs import hookimpl
from passkit.instruments import timing
from passkit.core.pass_api import graph_pass
from passkit.core.report import StepRecord


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


CLOCK = FakeClock()


@graph_pass("test.slow_pass")
def slow_pass(program) -> bool:
    """Take 0.25 s of the fake clock."""
    CLOCK.advance(0.25)
    return False


@graph_pass("test.sleepy")
def sleepy(program) -> bool:
    """Sleep 20 ms of real time."""
    time.sleep(0.02)
    return False


class TimedPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [slow_pass, sleepy]


class SlowInstrument:
    """An outer instrument (registered after timing) that takes 1 s of the fake clock around each step."""

    @hookimpl(wrapper=True)
    def passkit_run_step(self, context) -> Generator[None, object, object]:
        CLOCK.advance(0.5)
        try:
            return (yield)
        finally:
            CLOCK.advance(0.5)


def _kit_with_passes(kit):
    from passkit.core.registry import build_registry

    kit.pm.register(TimedPasses(), name="timed")
    kit.registry = build_registry(kit.pm)
    return kit


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    monkeypatch.setattr(time, "perf_counter", CLOCK)
    return CLOCK


def test_step_time_is_the_pass_own_time(kit, program_factory, fake_clock) -> None:
    kit = _kit_with_passes(kit)
    kit.pm.register(SlowInstrument(), name="slow_instrument")
    report = kit.run(kit.pipeline("test.noop", "test.slow_pass"), program_factory())
    noop_record, slow_record = report.records
    # The outer instrument's second per step is in the run's total but in no step's figure.
    assert (noop_record.seconds, slow_record.seconds) == (0.0, 0.25)
    assert report.seconds == pytest.approx(2 * 1.0 + 0.25)


def test_step_time_on_the_real_clock_covers_the_pass(kit, program_factory) -> None:
    kit = _kit_with_passes(kit)
    report = kit.run(kit.pipeline("test.noop", "test.sleepy"), program_factory())
    noop_record, sleepy_record = report.records
    assert sleepy_record.seconds >= 0.02
    assert report.seconds >= noop_record.seconds + sleepy_record.seconds


def test_failing_step_is_still_timed(fake_clock) -> None:
    record = StepRecord(0, "x", "x")
    step = timing.passkit_run_step(SimpleNamespace(record=record))
    next(step)
    fake_clock.advance(0.125)
    with pytest.raises(ValueError, match="late failure"):
        step.throw(ValueError("late failure"))
    assert record.seconds == 0.125


def test_without_the_timing_plugin_seconds_stay_zero(kit, program_factory) -> None:
    kit = _kit_with_passes(kit)
    kit.pm.unregister(timing)
    report = kit.run(kit.pipeline("test.sleepy"), program_factory())
    assert report.records[0].seconds == 0.0
