"""Measure what one call allocates on the CPU (bytes handed out, the peak of what was live) and
what autograd saves for the backward.

``allocations`` is shared by tests/passes/test_reinplace.py and benchmarks/patterns.py. It reads
the events of ``torch.profiler`` with ``profile_memory``: each op's own allocations minus frees,
in order. ``saved_from_outside`` counts what ``saved_tensors_hooks`` sees, each storage once.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
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


def saved_from_outside(step: Callable[[], Any]) -> int:
    """Bytes of every storage that autograd saves during ``step()``, each storage once."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())
