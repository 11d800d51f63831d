"""Own torch's own graph passes that passkit wraps: the min-cut partitioner, fake-value
propagation and reinplacing.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx
from torch.fx import GraphModule

from passkit._torch.tracing import fake_mode_of

__all__ = [
    "min_cut_partition",
    "propagate_fake_values",
    "reinplace_graph",
]


# -- partitioning ---------------------------------------------------------------------------


def min_cut_partition(
    joint: GraphModule, num_fwd_outputs: int, *, memory_budget: float = 1.0
) -> tuple[GraphModule, GraphModule]:
    """torch's min-cut rematerialization partitioner on a joint graph named primals_*/tangents_*."""
    import torch._functorch.config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    with functorch_config.patch(activation_memory_budget=memory_budget):
        return min_cut_rematerialization_partition(
            joint, None, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=[]
        )


# -- pattern rewrites --------------------------------------------------------------------------


def propagate_fake_values(gm: GraphModule) -> str | None:
    """Re-derive every node's ``meta["val"]`` from the placeholders' fake values.

    Returns None, or the first line of the error a node raised (a ``view`` that the new
    strides do not allow, for example); then some nodes may hold new values, others old ones.
    """
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = fake_mode_of(values)
    if mode is None:
        return "no fake values on the placeholders"
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*values)
    except Exception as exc:  # the op's own error says what it could not take
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return None


# --- reinplacing (the ``reinplace`` pass) -------------------------------------------------------


def reinplace_graph(gm: torch.fx.GraphModule, sample_args: Sequence[Any]) -> None:
    """Run torch's functional-to-in-place pass (``torch.fx.passes.reinplace``) on ``gm``.

    It turns ``b = op(a)`` into ``a.op_()`` where neither ``a`` nor any alias of it is read
    later, is a graph input or is returned, and removes ``{view}_scatter`` ops the same way.
    ``sample_args`` may be fake tensors of another mode; the pass re-derives metadata on its own
    fake mode and leaves it in ``meta`` under ``fake_result``, ``node_idx`` and ``view_of``,
    which are dropped here.
    """
    from torch.fx.passes.reinplace import reinplace

    reinplace(gm, *sample_args)
    for node in gm.graph.nodes:
        for key in ("fake_result", "node_idx", "view_of"):
            node.meta.pop(key, None)
