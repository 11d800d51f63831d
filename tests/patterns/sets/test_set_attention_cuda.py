"""The attention set on graphs built for CUDA: a causal mask the model builds on the GPU is
proved causal there (on a GPU machine), and a graph traced for CUDA on a machine without one
still has its constants evaluated (on the CPU)."""

from __future__ import annotations

import pytest
import torch

from passkit.examples import transformer
from passkit.patterns import constant_value
from passkit.testing import assert_pattern_matches


def _causal_mask_graph() -> torch.fx.GraphModule:
    """``torch.ones(16, 16, dtype=bool, device="cuda").tril()``, as a graph records it."""
    graph = torch.fx.Graph()
    ones = graph.call_function(torch.ops.aten.ones.default, ([16, 16],),
                               {"dtype": torch.bool, "device": torch.device("cuda", 0), "pin_memory": False})
    graph.output(graph.call_function(torch.ops.aten.tril.default, (ones,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_a_constant_for_a_device_this_machine_lacks_is_computed_on_the_cpu() -> None:
    gm = _causal_mask_graph()
    (tril,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.tril.default]
    value = constant_value(tril)
    expected = torch.ones(16, 16, dtype=torch.bool, device=value.device).tril()
    assert (value.device.type, bool(value.equal(expected))) == ("cuda" if torch.cuda.is_available() else "cpu", True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_causal_mask_built_on_the_gpu_becomes_is_causal() -> None:
    # The mask is evaluated on the GPU; it was once compared with a CPU tensor there.
    attention = transformer.CausalSelfAttention(64, 4).cuda()
    assert_pattern_matches("attention", attention, torch.randn(2, 16, 64, device="cuda"), times=1)
