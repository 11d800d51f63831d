"""Collectives inside the graph: bucketed, overlapped and resharded, with eager's gradients.

A 4-layer SimpleFSDP stack (``passkit.examples.simple_fsdp``: parameters are ``Shard(0)``
DTensors gathered in the forward, gradients reduce-scattered in the backward) on two gloo
ranks, compiled with ``training-python`` (which runs ``collectives.reshard``,
``collectives.bucket`` and ``collectives.overlap``). Each variant's output and every local
gradient are compared with eager's on each rank; the report rows show what the passes did:

- ``bucket``: caps of one layer's bytes, so 16 gathers and 16 reduce-scatters become at most
  one per layer, and no wait is left exposed where compute could hide it;
- ``reshard``: ``after_forward = true`` gathers the parameters again in the backward, so the
  partitioner saves fewer bytes than with the gathered parameters kept;
- ``regions``: the same with the layers outlined first (``regions``, min_repeats 2);
- ``off``: the three passes disabled, the baseline for the counts;
- ``inference``: the forward alone under ``no_grad`` (``inference-python`` with the bucket and
  overlap steps added), whose ``main`` graph holds the gathers.
"""

from __future__ import annotations

import copy
import datetime
import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.slow

LAYERS, DIM = 4, 64
# One layer's parameters, gathered: (2 * 64 * 256 + 256 + 64) floats, 129 KiB.
LAYER_MB = (2 * DIM * 4 * DIM + 4 * DIM + DIM) * 4 / 2**20
CAPS = {"all_gather_mb": LAYER_MB, "reduce_scatter_mb": LAYER_MB}
PASSES = ("collectives.reshard", "collectives.bucket", "collectives.overlap")
VARIANTS = {
    "off": {"pipeline": {"extends": "training-python", "disable": list(PASSES)}},
    "bucket": {"pipeline": {"extends": "training-python"}, "override": {"collectives.bucket": CAPS}},
    "reshard": {"pipeline": {"extends": "training-python"},
                "override": {"collectives.bucket": CAPS, "collectives.reshard": {"after_forward": True}}},
    "regions": {"pipeline": {"extends": "training-python"}, "override": {"collectives.bucket": CAPS},
                "steps": [{"pass": "regions", "before": "functionalize", "min_repeats": 2}]},
}

INFERENCE = {"pipeline": {"extends": "inference-python"},
             "steps": [{"pass": "collectives.bucket", "before": "codegen.python", **CAPS},
                       {"pass": "collectives.overlap", "before": "codegen.python"}]}


def _rank_main(rank: int, world: int, init_method: str, out_dir: str) -> None:
    import passkit
    from passkit.examples.simple_fsdp import mlp_stack, simple_fsdp
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        torch.set_num_threads(1)
        mesh = init_device_mesh("cpu", (world,))
        base = mlp_stack(LAYERS, DIM)
        torch.manual_seed(10 + rank)
        x = torch.randn(8, DIM)
        results = {}
        with torch.no_grad():
            model = simple_fsdp(copy.deepcopy(base), mesh)
            expected = model(x)
            torch._dynamo.reset()
            backend = passkit.backend(INFERENCE)
            actual = torch.compile(model, backend=backend)(x)
            (report,) = backend.reports
            rows = {r.id: (r.changed, dict(r.stats)) for r in report.records if r.status == "ran"}
        results["inference"] = (expected, actual, rows)
        for name in ("eager", *VARIANTS):
            model = simple_fsdp(copy.deepcopy(base), mesh)
            torch._dynamo.reset()
            backend = None if name == "eager" else passkit.backend(VARIANTS[name])
            runner = model if backend is None else torch.compile(model, backend=backend)
            out = runner(x)
            out.square().mean().backward()
            grads = [p.grad.to_local().clone() for p in model.parameters()]
            rows = {}
            if backend is not None:
                assert not backend.fallbacks, backend.fallbacks
                for report in backend.reports:
                    rows.update({r.id: (r.changed, dict(r.stats)) for r in report.records if r.status == "ran"})
            results[name] = (out.detach(), grads, rows)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_bucketed_overlapped_resharded_collectives_match_eager(tmp_path, spawn_ranks) -> None:
    world = 2
    spawn_ranks(_rank_main, str(tmp_path), world=world, deadline=540)
    for rank in range(world):
        results = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        out_e, grads_e, _ = results["eager"]
        for name in VARIANTS:
            out, grads, _ = results[name]
            torch.testing.assert_close(out, out_e, rtol=1e-5, atol=1e-5, msg=lambda m: f"rank {rank} {name} output: {m}")
            assert len(grads) == len(grads_e) == 4 * LAYERS
            for i, (g, g_e) in enumerate(zip(grads, grads_e)):
                torch.testing.assert_close(g, g_e, rtol=1e-5, atol=1e-5, msg=lambda m: f"rank {rank} {name} grad {i}: {m}")

        rows = results["bucket"][2]
        bucket, overlap = rows["collectives.bucket"], rows["collectives.overlap"]
        assert bucket[0] and overlap[0]
        before_ag, after_ag = map(int, bucket[1]["all_gather"].split("->"))
        before_rs, after_rs = map(int, bucket[1]["reduce_scatter"].split("->"))
        assert (before_ag, before_rs) == (4 * LAYERS, 4 * LAYERS)
        assert 1 < after_ag <= LAYERS and 1 < after_rs <= LAYERS, bucket[1]
        assert all(size <= LAYER_MB * 2**20 for sizes in bucket[1]["buckets"].values() for size in sizes)
        before, after = map(int, overlap[1]["exposed_waits"].split("->"))
        assert after < before and overlap[1]["hideable"] == 0, overlap[1]

        # Reshard after forward: the backward gathers again, so fewer bytes are saved.
        kept, resharded = results["bucket"][2], results["reshard"][2]
        assert not kept["collectives.reshard"][0] and resharded["collectives.reshard"][0]
        assert resharded["collectives.reshard"][1]["regathered"] == kept["collectives.reshard"][1]["gathers"] > 0
        saved_kept = kept["partition.default"][1]["saved_bytes"]
        saved_resharded = resharded["partition.default"][1]["saved_bytes"]
        gathered = kept["collectives.reshard"][1]["gathered_bytes"]
        assert saved_kept - saved_resharded == gathered // world, (saved_kept, saved_resharded, gathered)

        # With the layers outlined first the passes still run on what the graphs hold.
        assert results["regions"][2]["regions"][0], "regions outlined nothing"

        # Inference: the gathers of ``main`` bucketed and overlapped, the same output.
        expected, actual, rows = results["inference"]
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        assert rows["collectives.bucket"][1]["all_gather"] == bucket[1]["all_gather"]
        assert rows["collectives.overlap"][0]

        # Without the passes, the rows are absent and every wait is exposed.
        assert not any(step in results["off"][2] for step in PASSES)
