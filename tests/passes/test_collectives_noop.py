"""The collectives passes leave a graph without collectives exactly as it is.

``training`` and ``training-python`` run ``collectives.reshard``, ``collectives.bucket`` and
``collectives.overlap`` on every program; without collectives each returns False, touches no
node and records nothing, and the compiled step still equals eager's.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

import passkit

PASSES = ("collectives.reshard", "collectives.bucket", "collectives.overlap")


def test_collective_passes_leave_a_graph_without_collectives_unchanged() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    compiled = passkit.compile(twin, pipeline="training-python")
    x = torch.randn(3, 8)
    out, out_c = model(x), compiled(x)
    out.sum().backward()
    out_c.sum().backward()
    torch.testing.assert_close(out_c, out)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    (report,) = compiled.passkit_reports
    rows = {r.id: r for r in report.records}
    for step in PASSES:
        row = rows[step]
        assert (row.status, row.changed, row.claimed_changed, row.stats) == ("ran", False, False, {}), step
        assert row.nodes_before == row.nodes_after, step
