"""The timing instrument fills record.seconds with the pass's own time."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from passkit.hookspecs import hookimpl
from passkit.instruments import timing
from passkit.pass_api import graph_pass
from passkit.report import StepRecord


@graph_pass("test.sleepy")
def sleepy(program) -> bool:
    """Sleep 20 ms."""
    time.sleep(0.02)
    return False


class SleepyPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [sleepy]


def _kit_with_sleepy(kit):
    from passkit.registry import build_registry

    kit.pm.register(SleepyPasses(), name="sleepy")
    kit.registry = build_registry(kit.pm)
    return kit


def test_step_time_is_recorded(kit, program_factory) -> None:
    kit = _kit_with_sleepy(kit)
    report = kit.run(kit.pipeline("test.noop", "test.sleepy"), program_factory())
    noop_record, sleepy_record = report.records
    assert 0.02 <= sleepy_record.seconds < 0.5
    assert noop_record.seconds < 0.02
    assert report.seconds >= sleepy_record.seconds


def test_failing_step_is_still_timed() -> None:
    record = StepRecord(0, "x", "x")
    step = timing.passkit_run_step(SimpleNamespace(record=record))
    next(step)
    time.sleep(0.01)
    with pytest.raises(ValueError, match="late failure"):
        step.throw(ValueError("late failure"))
    assert record.seconds >= 0.01


def test_without_the_timing_plugin_seconds_stay_zero(kit, program_factory) -> None:
    kit = _kit_with_sleepy(kit)
    kit.pm.unregister(timing)
    report = kit.run(kit.pipeline("test.sleepy"), program_factory())
    assert report.records[0].seconds == 0.0
