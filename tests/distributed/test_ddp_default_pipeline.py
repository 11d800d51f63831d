"""DDP's multi-graph programs on the default pipeline, and a reproducer for a step that fails in one.

Two gloo ranks, ``bucket_cap_mb=1``, a 2-layer d=256 transformer block: Dynamo's DDP optimizer
splits it into several graphs and compiles each on the fake outputs of the piece before it,
which carry that piece's autograd history. passkit takes each such input as a fresh leaf: the
joint trace once differentiated through the history, which put the previous piece's fake values
into the graph as constants (``codegen.inductor``: ``Cannot access data pointer of Tensor``) and,
when the reproducer rebuilt the program, backpropagated through the history a second time.

Each spawn has a deadline, so a gloo deadlock fails the test instead of hanging the suite.
"""

from __future__ import annotations

import copy
import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from test_ddp_fsdp import sgd_steps_side_by_side

pytestmark = pytest.mark.slow

DIM = 256
BUCKET_MB = 1
WORLD = 2
DEADLINE_S = 540


def _init(rank: int, world: int, init_method: str) -> None:
    # A collective that waits longer than this raises instead of hanging (spawn_ranks has its own deadline).
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=DEADLINE_S))
    torch.set_num_threads(1)


def _model() -> nn.Module:
    from passkit.examples.transformer import Block

    torch.manual_seed(0)
    return nn.Sequential(Block(DIM, 4), Block(DIM, 4))


def _train_rank(rank: int, world: int, init_method: str, out_dir: str, pipeline: str) -> None:
    import passkit

    _init(rank, world, init_method)
    try:
        base = _model()
        eager = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=BUCKET_MB)
        twin = nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=BUCKET_MB)
        backend = passkit.backend(pipeline, repro_dir=os.path.join(out_dir, f"repro{rank}"))
        compiled = torch.compile(twin, backend=backend)
        steps = sgd_steps_side_by_side(eager, twin, compiled, rank, DIM)
        ran = [[r.id for r in report.records if r.status == "ran"] for report in backend.reports]
        torch.save({"steps": steps, "ran": ran}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("pipeline", ["training", "training-python"])
def test_multi_graph_ddp_matches_eager_ddp(tmp_path: Path, spawn_ranks, pipeline: str) -> None:
    spawn_ranks(_train_rank, str(tmp_path), pipeline, world=WORLD, deadline=DEADLINE_S)
    codegen = "codegen.inductor" if pipeline == "training" else "codegen.python"
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert len(results["ran"]) >= 2, "the DDP optimizer should have split the model into several graphs"
        assert all("joint" in ran and codegen in ran for ran in results["ran"])
        steps = results["steps"]
        for step in range(0, len(steps), 2):
            (out_e, grads_e), (out_c, grads_c) = steps[step], steps[step + 1]
            torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
            for i, (g_e, g_c) in enumerate(zip(grads_e, grads_c)):
                torch.testing.assert_close(g_c, g_e, rtol=1e-5, atol=1e-5, msg=lambda m: f"rank {rank} step {step // 2} grad {i}: {m}")


class _FailsOnALaterPiece:
    """A plugin whose pass fails in every DDP piece that takes two values of the pieces before it
    (an activation and the residual stream it was computed from: the joint trace once walked
    from one into the other's history)."""

    @staticmethod
    def _pass() -> Any:
        import passkit

        @passkit.graph_pass("ddp_test.fail_in_a_later_piece", requires={"joint"})
        def fail_in_a_later_piece(program: passkit.Program) -> bool:
            """Fail when two inputs are outputs of earlier pieces (not autograd leaves)."""
            if sum(not info.is_leaf for info in program.signature.inputs) >= 2:
                raise RuntimeError("planted failure in a later piece")
            return False

        return fail_in_a_later_piece

    @staticmethod
    def plugin() -> Any:
        from passkit.core.hookspecs import hookimpl

        planted = _FailsOnALaterPiece._pass()

        class Plugin:
            @hookimpl
            def passkit_register_passes(self) -> list:
                return [planted]

        return Plugin()


def _failing_rank(rank: int, world: int, init_method: str, out_dir: str) -> None:
    import passkit
    from passkit.core.plugins import get_plugin_manager

    _init(rank, world, init_method)
    try:
        get_plugin_manager().register(_FailsOnALaterPiece.plugin(), name="ddp_test")
        pipeline = Path(out_dir) / "failing.toml"
        if rank == 0:
            pipeline.write_text(
                '[pipeline]\nname = "failing"\nextends = "training"\n\n'
                '[[steps]]\npass = "ddp_test.fail_in_a_later_piece"\nafter = "joint"\n'
            )
        dist.barrier()
        repro_dir = os.path.join(out_dir, f"repro{rank}")
        model = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_MB)
        compiled = torch.compile(model, backend=passkit.backend(str(pipeline), repro_dir=repro_dir))
        try:
            compiled(torch.randn(2, 8, DIM)).sum().backward()
            message = "no error"
        except passkit.PassError as exc:
            message = str(exc)
        Path(out_dir, f"rank{rank}.txt").write_text(message)
    finally:
        dist.destroy_process_group()


def test_a_step_failing_in_a_later_ddp_piece_writes_a_reproducer(tmp_path: Path, spawn_ranks) -> None:
    spawn_ranks(_failing_rank, str(tmp_path), world=WORLD, deadline=DEADLINE_S)
    for rank in range(WORLD):
        message = (tmp_path / f"rank{rank}.txt").read_text()
        assert "failed: RuntimeError: planted failure in a later piece" in message
        folder = message.rsplit("(reproducer: ", 1)[-1].rstrip(")")
        assert folder.startswith(str(tmp_path / f"repro{rank}")), message
        assert (Path(folder) / "manifest.json").is_file(), message
