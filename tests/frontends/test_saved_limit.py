"""max_saved holds for a whole model that Dynamo splits into several graphs, measured from outside."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
from torch import nn

import passkit
from allocations import saved_from_outside


class _TwoGraphs(nn.Module):
    """Two MLPs with a graph break between them: Dynamo compiles each as a training graph."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.Tanh())
        self.second = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 64), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        torch._dynamo.graph_break()
        return self.second(hidden)


def _inputs() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(128, 64)


def _pipeline(tmp_path, **options) -> str:
    lines = ['[pipeline]', 'name = "limited"', 'extends = "training-python"', 'disable = ["partition.default"]', '',
             '[[steps]]', 'pass = "partition.min_cut"', 'after = "partition.default"']
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in options.items()]
    path = tmp_path / "limited.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _step(model):
    model.zero_grad(set_to_none=True)
    loss = model(_inputs()).square().mean()
    loss.backward()
    return loss


def _saved_per_graph(tmp_path, **options) -> list[int]:
    compiled = passkit.compile(_TwoGraphs(), pipeline=_pipeline(tmp_path, **options))
    _step(compiled)
    return [r.stats["saved_bytes"] for report in compiled.passkit_backend.reports for r in report.records if "saved_bytes" in r.stats]


def _compiled_step_within(tmp_path, limit):
    """Train the same model eagerly and under ``max_saved = limit``; return the compiled model
    and the bytes its second forward saves, measured from outside (gradients checked equal)."""
    eager = _TwoGraphs()
    model = copy.deepcopy(eager)
    compiled = passkit.compile(model, pipeline=_pipeline(tmp_path, max_saved=limit))
    _step(compiled)
    outputs = []  # a graph re-planned after the first step compiles again here, under the hooks
    measured = saved_from_outside(lambda: outputs.append(compiled(_inputs())))  # the model's own forward
    outputs[0].square().mean().backward()
    torch.testing.assert_close(_step(compiled), _step(eager))
    for ours, theirs in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    return compiled, measured


def test_a_later_graph_gets_what_the_earlier_ones_leave(tmp_path) -> None:
    fastest = _saved_per_graph(tmp_path)
    smallest = _saved_per_graph(tmp_path, memory_budget=0.0)
    assert len(fastest) == len(smallest) == 2
    limit = fastest[0] + (smallest[1] + fastest[1]) // 2  # each graph fits alone, both do not
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled, measured = _compiled_step_within(tmp_path, limit)
    assert not [w for w in caught if "max_saved" in str(w.message)]  # nothing was re-planned
    assert sum(smallest) < measured <= limit < sum(fastest)
    saved = [r.stats["saved_bytes"] for report in compiled.passkit_backend.reports for r in report.records if "saved_bytes" in r.stats]
    assert saved[0] == fastest[0] and smallest[1] < saved[1] < fastest[1]


def test_earlier_graphs_are_re_planned_when_a_later_one_cannot_fit(tmp_path) -> None:
    fastest = _saved_per_graph(tmp_path)
    smallest = _saved_per_graph(tmp_path, memory_budget=0.0)
    limit = (sum(smallest) + fastest[0] + smallest[1]) // 2
    assert sum(smallest) <= limit < fastest[0] + smallest[1]  # the second graph cannot fit after the first
    warning = (f"passkit: max_saved = {limit} holds for the whole model, which Dynamo split into 2 graphs; the graphs "
               "compiled first are re-planned at their next call to fit (this step saved more than the limit)")
    with pytest.warns(RuntimeWarning, match=f"^{re.escape(warning)}$"):
        compiled, measured = _compiled_step_within(tmp_path, limit)
    assert measured <= limit
    first, second, replanned = [[r.stats for r in report.records if "saved_bytes" in r.stats][0]
                                for report in compiled.passkit_backend.reports]
    assert first["saved_bytes"] == fastest[0] and second["saved_bytes"] == smallest[1]
    assert replanned["saved_bytes"] <= limit - smallest[1] < first["saved_bytes"]


def test_a_limit_the_graphs_cannot_meet_together_is_a_one_line_error(tmp_path) -> None:
    smallest = _saved_per_graph(tmp_path, memory_budget=0.0)
    limit = max(smallest)  # enough for either graph, not for both
    assert limit < sum(smallest)
    compiled = passkit.compile(_TwoGraphs(), pipeline=_pipeline(tmp_path, max_saved=limit))
    with pytest.raises(passkit.PassError) as info:
        _step(compiled)
    assert str(info.value) == (
        f"max_saved = {limit} cannot be met by this model: Dynamo split it into 2 graphs, "
        f"whose smallest plans save {sum(smallest)} bytes together"
    )
