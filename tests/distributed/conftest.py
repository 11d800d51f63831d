"""``spawn_ranks``: run a function on several gloo ranks, with a rendezvous that needs no port and a
deadline that turns a deadlock into a failure.

The ranks meet through a file store in the test's temp folder, so no test picks a "free" port
that another xdist worker could take first. Each rank gets ``(rank, world, init_method, *args)``
and passes ``init_method`` to ``dist.init_process_group``. If the ranks have not all finished by
the deadline, the survivors are killed and the test fails naming the deadline, instead of
hanging CI until pytest-timeout's limit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch.multiprocessing as mp

DEADLINE = 600.0  # seconds for all ranks together, spawn and imports included


@pytest.fixture
def spawn_ranks(tmp_path: Path) -> Callable[..., None]:
    count = 0

    def spawn(fn: Callable[..., Any], *args: Any, world: int = 2, deadline: float = DEADLINE) -> None:
        nonlocal count
        count += 1
        init_method = f"file://{tmp_path / f'rendezvous-{count}'}"
        context = mp.start_processes(fn, args=(world, init_method, *args), nprocs=world, join=False, start_method="spawn")
        end = time.monotonic() + deadline
        while not context.join(timeout=max(0.0, end - time.monotonic())):  # re-raises a rank's error
            if time.monotonic() >= end:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                pytest.fail(f"{world} ranks of {fn.__name__} did not finish within {deadline:.0f} s (a deadlock?); killed them", pytrace=False)

    return spawn
