"""Own the decompositions passkit supplies itself, where torch's break a Core ATen program.

**Layouts.** passkit corrects decompositions whose outputs are not laid out as the op's own kernel
lays them.

A graph traced before decomposition records views that hold for the op's real output strides
(its meta function's); a later ``.view`` in the graph relies on them, since tracing drops a
``.contiguous()`` that was a no-op then. A decomposition whose output has other strides breaks
that view at run time ("Cannot view a tensor with shape ... and strides ..."). torch's
decomposition of the CPU flash attention lays its output out for ``nn.MultiheadAttention``'s
permute, while the kernel (``empty_like(query)``) follows the query's layout: Hugging Face
GPT-2's Core ATen export fails on it. The corrected decomposition copies the math into a tensor
laid out like the query, as the kernel does.

**Left outside Core ATen.** The functional batch norm's decomposition (which passkit's
``core_aten`` table adds, since torch's leaves the op whole) computes its statistics with
``var_mean``, which is not Core ATen and whose only torch decomposition goes through prims that
functionalization refuses; ``lowering_to_core`` lowers it to ``var`` and ``mean`` for a step that
names it in ``extra`` (the ``export`` pipeline does). The ``core_aten`` table itself keeps it: the
Triton plugin fuses a layer norm's one ``var_mean`` reduction into one kernel.

**Constants built inside.** ``torch.tensor(...)`` inside a traced function is a constant and a
``lift_fresh_copy`` of it, outside Core ATen; ``clone_lifted_constants`` rewrites it as ``clone``
in the one trace that sees it (``joint`` of a captured graph, which no functionalization ran over).

**Indices kept as tensors.** torch's ``take`` decomposition indexes with Python's ``[]``, which
reads a 0-dim index tensor as a number (``.item()``): the trace then needs that number as a
size and stops ("Could not extract specialized integer from data-dependent expression"), though
the index is plain data. ``take`` (and ``put``'s backward, which calls it) lowers to
``aten.index`` with the index as a tensor, what ``[]`` does for every other index; every table
passkit lowers through, Inductor's included, gets it (``reading_no_values``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["clone_lifted_constants", "lowering_to_core", "reading_no_values", "with_corrected_layouts"]


def _flash_attention_for_cpu(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0, is_causal: bool = False,
    attn_mask: torch.Tensor | None = None, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(dropout_p == 0.0, lambda: f"dropout probability must be zero, got {dropout_p}")
    output, attention = torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, dropout_mask=None,
        scale=scale, enable_gqa=query.size(1) != key.size(1),
    )
    # The second result stands where the kernel returns its logsumexp, as in torch's own
    # decomposition: only the kernel's backward reads it, and no decomposed graph calls that.
    return torch.ops.aten.copy.default(torch.empty_like(query), output), attention


_CORRECTED: dict[Any, Callable[..., Any]] = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_attention_for_cpu,
}


def _take(self: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.index.Tensor(self.reshape(-1), [index])


_INDEX_AS_TENSOR: dict[Any, Callable[..., Any]] = {torch.ops.aten.take.default: _take}


def reading_no_values(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """``table`` with decompositions that keep an index tensor a tensor where torch's read it."""
    return {op: _INDEX_AS_TENSOR.get(op, fn) for op, fn in table.items()}


def with_corrected_layouts(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """``table`` with passkit's corrected decompositions wherever it holds torch's."""
    return reading_no_values({op: _CORRECTED.get(op, fn) for op, fn in table.items()})


def _var_mean(x: torch.Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    variance = torch.ops.aten.var.correction(x, dim, correction=correction, keepdim=keepdim)
    return variance, torch.ops.aten.mean.dim(x, dim, keepdim)


def lowering_to_core() -> dict[Any, Callable[..., Any]]:
    """passkit's decompositions of ops that torch's Core ATen tables leave outside Core ATen, for
    a ``decompose`` step's ``extra``."""
    return {torch.ops.aten.var_mean.correction: _var_mean}


def clone_lifted_constants(gm: torch.fx.GraphModule) -> bool:
    """Rewrite each ``lift_fresh_copy`` in ``gm`` (a ``torch.tensor(...)`` built inside the traced
    function: a jagged tensor's offsets) as the ``clone`` it is; ``make_fx`` records the op after
    consulting its decomposition table, so no table can lower it."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.lift_fresh_copy.default:
            node.target = torch.ops.aten.clone.default
            changed = True
    return changed
