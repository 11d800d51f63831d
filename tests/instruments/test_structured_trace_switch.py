"""Only a real handler on torch's trace logger turns passkit's structured trace artifacts on.

pytest's log capture attaches its handlers to every logger that does not propagate, torch's
trace logger included; counted as the trace, they made every step of every compile under pytest
emit its artifacts, each with the Python stack torch records outside a Dynamo compile.
"""

from __future__ import annotations

import logging

import pytest
from _pytest.logging import LogCaptureHandler
from torch._logging._internal import trace_log

from passkit import _torch


def test_pytest_capture_handlers_alone_leave_the_trace_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_log, "handlers", [LogCaptureHandler()])
    assert not _torch.structured_trace_enabled()


def test_any_other_handler_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_log, "handlers", [LogCaptureHandler(), logging.NullHandler()])
    assert _torch.structured_trace_enabled()
