"""``joint.inductor_passes`` simplifies the joint graph as torch.compile does, keeps training equal
to eager (dropout included), works on inference programs, and says in one line where it cannot run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import passkit

from tiny_programs import assert_seeded_steps_match_eager

pytestmark = pytest.mark.slow  # the pipelines here end in Inductor compiling C++ kernels

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


class PointlessTransposes(nn.Module):
    """A transpose pair and a view to the same shape: what Inductor's joint patterns remove."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.transpose(0, 1).transpose(0, 1)).view(4, 8).relu()


def _pipeline(tmp_path, name: str, base: str, body: str = "") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[pipeline]\nname = "{name}"\nextends = "{base}"\n{body}')
    return str(path)


def _record(compiled, step_id: str):
    (report,) = compiled.passkit_reports
    return next(r for r in report.records if r.id == step_id)


def test_training_removes_pointless_ops_from_the_joint_graph_and_trains_like_eager() -> None:
    compiled = assert_seeded_steps_match_eager(PointlessTransposes, torch.randn(4, 8), "training", steps=1)
    record = _record(compiled, "joint.inductor_passes")
    assert record.changed
    assert record.nodes_after < record.nodes_before


class RandomMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (torch.rand(x.shape) > 0.5)


def test_random_ops_stay_atens_so_a_seeded_step_draws_eagers_numbers() -> None:
    # Inductor's joint passes would swap `rand` for Inductor's own generator unless
    # `fallback_random` is set; the training pipeline promises eager's draws.
    assert_seeded_steps_match_eager(RandomMask, torch.randn(4, 8), "training")


def test_torchs_partitioner_can_follow_it(tmp_path) -> None:
    body = '\ndisable = ["partition.min_cut"]\n\n[[steps]]\npass = "partition.torch_min_cut"\nafter = "joint.inductor_passes"\n'
    assert_seeded_steps_match_eager(PointlessTransposes, torch.randn(4, 8), _pipeline(tmp_path, "torch-cut", "training", body), steps=1)


def test_the_inference_pipeline_simplifies_main() -> None:
    torch._dynamo.reset()
    model = PointlessTransposes().eval()
    compiled = passkit.compile(model, pipeline="inference", cache="off")
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
    record = _record(compiled, "joint.inductor_passes")
    assert record.changed and record.nodes_after < record.nodes_before


def test_after_the_partitioner_it_says_where_it_belongs(tmp_path) -> None:
    torch._dynamo.reset()
    body = '\ndisable = ["joint.inductor_passes"]\n\n[[steps]]\nid = "late"\npass = "joint.inductor_passes"\nafter = "fx.dce"\n'
    path = _pipeline(tmp_path, "late", "training", body)
    compiled = passkit.aot_function(lambda x: x.sin() * 2, pipeline=path, cache="off", repro_dir=str(tmp_path / "repro"))
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(3, requires_grad=True))
    pipeline = passkit.load_pipeline(path)
    late = pipeline.step("late")
    ran_before = ", ".join(s.id for s in pipeline.steps[: late.position] if s.enabled)
    assert str(info.value) == (
        f"{pipeline.where(late)} failed: PassError: joint.inductor_passes: no 'joint' or 'main' graph to simplify "
        f"(graphs: forward, backward); run it before the partitioner (after: {ran_before}) "
        f"(reproducer: {tmp_path / 'repro'}/{late.position + 1:02d}-late)"
    )
