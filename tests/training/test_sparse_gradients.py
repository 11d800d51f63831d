"""A parameter whose gradient is a sparse tensor: ``EmbeddingBag(sparse=True)``, trained as
torch's ``test_embedding_bag_view_dynamic`` trains it (its output viewed flat), static and with
``dynamic=True``, beside torch's own Inductor (``backend="inductor"``) and ``aot_eager``.

The backward returns ``_embedding_bag_backward``'s sparse gradient. Before, ``codegen.inductor``
failed on it (a sparse tensor has no storage to compare with the backward's inputs), and with
``dynamic=True`` the joint trace failed in the op's C++ fake rule ("Cannot call numel() on
tensor with symbolic sizes"), which torch's AOT path runs under its Python dispatcher.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import passkit


class _ViewedBag(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(100, 8, sparse=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.emb(x, y).view(-1)


def _steps(model: torch.nn.Module, compiled: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    results = []
    for n in (3, 5):  # a second size reuses a dynamic program
        x, offsets = torch.arange(n) * 7, torch.arange(n)
        out = compiled(x, offsets)
        out.backward(torch.linspace(0.5, 1.5, out.numel()))
        grad = model.emb.weight.grad
        assert grad is not None and grad.is_sparse
        results.append((out.detach(), grad.coalesce().to_dense()))
        model.zero_grad(set_to_none=True)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("backend", ["training", "training-python"])
def test_a_sparse_embedding_bag_trains_as_eager_and_torchs_inductor(backend: str, dynamic: bool) -> None:
    torch.manual_seed(0)
    model = _ViewedBag()
    expected = _steps(model, model)
    for reference in ("inductor", "aot_eager", backend):
        torch._dynamo.reset()
        trained = copy.deepcopy(model)
        compiler = passkit.backend(reference) if reference == backend else reference
        compiled = torch.compile(trained, backend=compiler, dynamic=dynamic)
        torch.testing.assert_close(_steps(trained, compiled), expected, msg=lambda m: f"{reference}: {m}")
    assert compiler.reports
