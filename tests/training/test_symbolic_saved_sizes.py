"""A backward that takes a saved view whose size is a product of symbols (``s75*s95``).

``embedding_bag`` of a 2-D index tensor flattens it; with ``dynamic=True`` the flattened view
is saved for ``_embedding_bag_backward`` and binds neither symbol of its size. The partition
now saves the symbol's own input too, as torch's partitioner does; before, Inductor could not
compile the backward ("expected [s95] to have been codegen-ed").
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import passkit


def _max_bag_of_a_viewed_weight(idx: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    return F.embedding_bag(idx, base.view(10, 4), mode="max")


def _mean_bag_of_a_sliced_weight(idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding_bag(idx, weight[:, :3], mode="mean")


PROGRAMS = {
    "max_bag_of_a_viewed_weight": (_max_bag_of_a_viewed_weight, (40,)),
    "mean_bag_of_a_sliced_weight": (_mean_bag_of_a_sliced_weight, (10, 5)),
}


def _steps(fn: Callable[..., Any], weight_shape: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    results = []
    for bag in (4, 6):  # a second size reuses the symbolic program
        weight = torch.randn(weight_shape, requires_grad=True)
        out = fn(torch.randint(0, 10, (3, bag)), weight)
        out.backward(torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape))
        results.append((out.detach(), weight.grad))
    return results


@pytest.mark.parametrize("backend", ["training", "training-python", "aot_eager"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_dynamic_embedding_bag_of_a_view_trains_as_eager(program: str, backend: str) -> None:
    fn, weight_shape = PROGRAMS[program]
    torch._dynamo.reset()
    compiler = backend if backend == "aot_eager" else passkit.backend(backend)
    compiled = torch.compile(fn, backend=compiler, dynamic=True)
    torch.testing.assert_close(_steps(compiled, weight_shape), _steps(fn, weight_shape))
    if backend != "aot_eager":
        assert compiler.reports
