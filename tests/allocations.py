"""Measure what one call allocates on the CPU: bytes handed out and the peak of what was live.

Shared by tests/passes/test_reinplace.py and benchmarks/patterns.py. Reads the events of
``torch.profiler`` with ``profile_memory``: each op's own allocations minus frees, in order.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.profiler import ProfilerActivity, profile


def allocations(step: Callable[[], Any]) -> tuple[int, int]:
    """(bytes allocated, peak live bytes) over one call of ``step``."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = allocated = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak, allocated = max(peak, live), allocated + max(event.self_cpu_memory_usage, 0)
    return allocated, peak
