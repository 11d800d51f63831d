"""The ``spawn_ranks`` fixture: ranks meet without a port, and a hang fails at the deadline."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist


def _sum_ranks(rank: int, world: int, init_method: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        torch.save(total, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _hang(rank: int, world: int, init_method: str) -> None:
    time.sleep(3600)


@pytest.mark.slow
def test_two_ranks_meet_through_the_file_store(spawn_ranks, tmp_path: Path) -> None:
    spawn_ranks(_sum_ranks, str(tmp_path))
    assert [torch.load(tmp_path / f"rank{rank}.pt").item() for rank in range(2)] == [3.0, 3.0]


@pytest.mark.slow
def test_ranks_that_hang_fail_at_the_deadline(spawn_ranks) -> None:
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        spawn_ranks(_hang, deadline=3)
    assert str(failed.value) == "2 ranks of _hang did not finish within 3 s (a deadlock?); killed them"
    assert time.monotonic() - started < 600  # far below the hang's hour: the ranks were killed, not waited for
