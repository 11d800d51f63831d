"""Own the ``attention`` pattern set: explicit attention math -> ``aten.scaled_dot_product_attention``.

Forms matched (q, k, v of rank 4, ``k`` transposed in the product):

- ``softmax(q @ kᵀ · s) @ v`` with the scale as a multiplication, a division by a float, a
  division by a constant 0-d tensor (GPT-2's ``torch.full([], sqrt(d))``), or no scale;
- each of those with an additive float mask (HF GPT-2, BERT and Llama at
  ``attn_implementation="eager"``), passed on as ``attn_mask``;
- each with ``masked_fill(mask, -inf)`` before the softmax, when the mask is a constant of the
  graph (``ones(s, s).tril()``, ``triu(ones, 1)``): a causal mask becomes ``is_causal=True``;
  another constant mask is passed as its negation, but only when no row is fully masked (eager
  gives NaN there, fused kernels need not).

Dropout on the probabilities (``dropout(softmax(...)) @ v``, HF models in ``train()``) is
deliberately not matched while it draws: SDPA draws its mask inside its kernel (Philox on
CUDA, its own draw order in the CPU math path), so seeded training would stop reproducing
eager's masks, a change a user can see beyond float rounding. A dropout that draws nothing
(``p = 0``, ``training=False``, ``eval()``) leaves no op in the graph, and its form is matched as
the plain one. tests/patterns/sets/test_set_attention_dropout.py shows both.

Option ``cpu_min_score_bytes`` (``set_options.attention`` on the ``rewrite`` step; default 0:
rewrite everywhere) leaves attention on the CPU alone where its B·H·S·L score matrix is smaller:
there the flash kernel's per-block work costs more than the explicit math once Inductor fuses
the softmax (the shipped ``training`` pipeline sets it; figures there). Other devices are
always rewritten. A symbolic size counts as its hint: the choice is about speed only, so it adds
no guard.

Option ``cpu_causal_blocks`` (default 0: off) computes causal attention on the CPU that the
rewrite takes (past the size gate) as explicit math in that many blocks of query rows instead of
SDPA: block i multiplies its rows by the keys up to its last row only, so the product, the
softmax and their backward do (n + 1) / 2n of the full math's work (5/8 at 4 blocks), where the
CPU flash kernel runs its small per-block products at a fraction of the matmul rate. Each block
is the ops the math would be (``bmm``, ``where``, ``_softmax``) on views of q, k, v made
contiguous once, with the causal mask from positions (``arange``), so Inductor fuses them as it
fuses the math, computes the mask inside the softmax kernels, and compiles one kernel a block
for every layer; the blocks save their probabilities (5/8 of the
S×S matrix at 4 blocks) where SDPA saves none. Rows are exact: a key past a row's position is
masked in the full math too.

The replacement is one ``scaled_dot_product_attention`` node: before ``joint`` autograd
differentiates it with its fused backward, which saves no S×S probabilities. The patterns'
``keep`` names SDPA and the kernels it dispatches to, so ``joint`` (which lowers through the
``decompose`` step's table) does not turn it straight back into the math.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pydantic
import torch

from passkit import _torch
from passkit.patterns.constants import constant_value
from passkit.patterns.model import Pattern, PatternSet
from passkit.patterns.trace import from_trace

__all__ = ["attention_set"]

aten = torch.ops.aten
_SCALE = 0.3019  # a float example argument: the traced literal binds the ``scale`` parameter
_KEEP = (
    "aten.scaled_dot_product_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten._scaled_dot_product_flash_attention_backward.default",
    "aten._scaled_dot_product_efficient_attention_backward.default",
)
_B, _H, _S, _L, _E, _EV = 2, 3, 5, 7, 11, 13  # distinct sizes, so views are told apart


def _scaled(scores: torch.Tensor, scale: Any, how: str) -> torch.Tensor:
    if how == "mul":
        return scores * scale
    if how == "div":
        return scores / scale
    return scores


def _make_search(scale_how: str, mask_how: str) -> Any:
    # One function per form: from_trace reads the parameter names.
    def search(q, k, v, scale, mask):  # noqa: ANN001, ANN202 - traced, not called by users
        scores = _scaled(q @ k.transpose(-2, -1), scale, scale_how)
        if mask_how == "add":
            scores = scores + mask
        elif mask_how == "masked_fill":
            scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(dim=-1) @ v

    search.__name__ = search.__qualname__ = f"attention_{scale_how}_{mask_how}"
    return search


def _scale_of(bindings: dict[str, Any], scale_how: str, head_dim: int) -> float | None:
    if scale_how == "none":
        return 1.0
    raw = bindings.get("scale")
    if scale_how == "div_tensor":
        raw = constant_value(raw)
        if not isinstance(raw, torch.Tensor) or raw.numel() != 1:
            return None
        raw = float(raw)
    if not isinstance(raw, (int, float)) or raw == 0 or not math.isfinite(raw):
        return None
    return float(raw) if scale_how == "mul" else 1.0 / float(raw)


def _mask_plan(match: Any) -> tuple[str, Any] | None:
    """How the mask goes to SDPA: ("causal", None), ("bool", mask) or ("none"/"float", node)."""
    mask = match.bindings.get("mask")
    if mask is None:
        return ("none", None)
    val = match.val("mask")
    if not isinstance(val, torch.Tensor):
        return None
    if val.dtype != torch.bool:
        return ("float", mask) if val.dtype == match.val("q").dtype else None
    value = constant_value(mask)
    if not isinstance(value, torch.Tensor):
        return None  # a mask computed from inputs may mask whole rows: eager would give NaN there
    rows, cols = match.val("q").shape[-2], match.val("k").shape[-2]
    full = value.expand(*value.shape[:-2], rows, cols) if value.dim() >= 2 else None
    if full is None or bool(full.all(dim=-1).any()):
        return None
    causal = torch.ones(rows, cols, dtype=torch.bool, device=full.device).triu(1)
    if rows == cols and bool((full == causal).all()):
        return ("causal", None)
    return ("bool", mask)


def _make_pattern(scale_how: str, mask_how: str) -> Pattern:
    q = torch.empty(_B, _H, _S, _E)
    k = torch.empty(_B, _H, _L, _E)
    v = torch.empty(_B, _H, _L, _EV)
    scale = torch.empty(()) if scale_how == "div_tensor" else _SCALE
    mask = torch.empty(_S, _L, dtype=torch.bool) if mask_how == "masked_fill" else torch.empty(_B, 1, _S, _L)
    how = "div" if scale_how == "div_tensor" else scale_how

    def search(q, k, v, scale, mask):  # noqa: ANN001, ANN202
        return _make_search(how, mask_how)(q, k, v, scale, mask)

    search.__name__ = search.__qualname__ = f"{scale_how}_{mask_how}"

    def check(match: Any) -> bool:
        vals = [match.val(name) for name in ("q", "k", "v")]
        if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in vals):
            return False
        if len({t.dtype for t in vals}) != 1:
            return False
        return _scale_of(match.bindings, scale_how, vals[0].shape[-1]) is not None and _mask_plan(match) is not None

    return from_trace(
        search, (q, k, v, scale, mask), build=_Replacement(scale_how), name=f"{scale_how}_{mask_how}",
        # A masked form is worth more than the unmasked one it contains.
        benefit=3 if mask_how != "none" else 2, check=check,
        # Rank 4 (batch, heads, sequence, head dim) is what SDPA's replacement is built for.
        pin_ranks=True,
        description=f"softmax(q @ kᵀ ({scale_how}) {mask_how}) @ v -> scaled_dot_product_attention",
        keep=_KEEP,
    )


@dataclasses.dataclass(frozen=True)
class _Replacement:
    """A match's replacement: one SDPA node, or causal CPU attention in ``cpu_causal_blocks``
    blocks of query rows. A frozen dataclass, so the set's fingerprint names its settings."""

    scale_how: str
    cpu_causal_blocks: int = 0

    def __call__(self, b: Any, q: Any, k: Any, v: Any, **bindings: Any) -> Any:
        match = _BuildView(b, dict(q=q, k=k, v=v, **bindings))
        scale = _scale_of(match.bindings, self.scale_how, b.val(q).shape[-1])
        kind, mask = _mask_plan(match)
        if kind == "causal" and self.cpu_causal_blocks and _blockable(b.val(q), b.val(v)):
            return _causal_blocks(b, q, k, v, scale, self.cpu_causal_blocks)
        if kind == "bool":
            mask = b.call(aten.logical_not.default, mask)
        return b.call(
            aten.scaled_dot_product_attention.default, q, k, v, mask if kind in ("bool", "float") else None,
            0.0, kind == "causal", scale=scale,
        )


def _blockable(q: torch.Tensor, v: torch.Tensor) -> bool:
    """CPU attention whose heads, rows and widths are fixed sizes (a symbolic batch is fine: the
    blocks' views name it as -1)."""
    return q.device.type == "cpu" and all(isinstance(size, int) for size in (*q.shape[1:], v.shape[-1]))


def _causal_blocks(b: Any, q: Any, k: Any, v: Any, scale: float, blocks: int) -> Any:
    """``softmax(q @ kᵀ · scale + causal mask) @ v``, block by block of query rows, each block
    against the keys up to its last row; the blocks' outputs concatenated along the rows.

    q, k and v are made contiguous once, as (B·H, S, E), so each block's operands are views of
    them that ``bmm`` reads in place: no copy per block, and no kernel per block to compile.
    """
    heads, rows = b.val(q).shape[1:3]
    device, dtype = b.val(q).device, b.val(q).dtype
    q3, k3, v3 = (
        b.call(aten._unsafe_view.default, b.call(aten.clone.default, t, memory_format=torch.contiguous_format),
               [-1, *b.val(t).shape[2:]])
        for t in (q, k, v)
    )
    hidden = b.call(aten.full.default, [], float("-inf"), dtype=dtype, device=device, pin_memory=False)
    size = -(-rows // blocks)
    outputs = []
    for start in range(0, rows, size):
        stop = min(start + size, rows)
        q_rows = b.call(aten.slice.Tensor, q3, 1, start, stop)
        k_seen, v_seen = (b.call(aten.slice.Tensor, t, 1, 0, stop) for t in (k3, v3))
        scores = b.call(aten.bmm.default, q_rows, b.call(aten.transpose.int, k_seen, 1, 2))
        scores = b.call(aten.mul.Tensor, scores, scale)
        block_hidden = _keys_after_rows(b, start, stop, device)
        # ``where``, not ``masked_fill``: a block is a causal attention of its own, and the set's
        # masked forms would take it again.
        scores = b.call(aten.where.self, block_hidden, hidden, scores)
        outputs.append(b.call(aten.bmm.default, b.call(aten._softmax.default, scores, -1, False), v_seen))
    attended = b.call(aten.cat.default, outputs, 1)
    return b.call(aten._unsafe_view.default, attended, [-1, heads, rows, b.val(v).shape[-1]])


def _keys_after_rows(b: Any, start: int, stop: int, device: torch.device) -> Any:
    """The causal mask of rows ``start:stop`` against keys ``0:stop``, from positions (``arange``),
    not from the user's mask: Inductor computes it inside the kernels that read it, so no layer
    needs a mask written out, nor a kernel to write it. Exact, since the set only calls a
    constant mask causal when it equals this one."""
    def positions(begin: int) -> Any:
        return b.call(aten.arange.start, begin, stop, dtype=torch.int64, device=device, pin_memory=False)

    rows = b.call(aten.unsqueeze.default, positions(start), 1)
    return b.call(aten.gt.Tensor, positions(0), rows)


class _BuildView:
    """What ``_mask_plan`` reads from a match, rebuilt from the bindings a builder gets."""

    def __init__(self, builder: Any, bindings: dict[str, Any]) -> None:
        self.builder, self.bindings = builder, bindings

    def val(self, name: str) -> Any:
        return self.builder.val(self.bindings[name])


class AttentionOptions(pydantic.BaseModel):
    """``set_options.attention``: where on the CPU the rewrite pays."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    cpu_min_score_bytes: int = pydantic.Field(default=0, ge=0)
    cpu_causal_blocks: int = pydantic.Field(default=0, ge=0, le=64)


def _score_bytes(match: Any) -> int:
    """Bytes of the B·H·S·L score matrix the explicit math would build."""
    q, k = match.val("q"), match.val("k")
    elements = 1
    for size in (*q.shape[:-1], k.shape[-2]):
        elements *= size if isinstance(size, int) else _torch.size_hint(size)
    return elements * q.element_size()


def _configure(attention: PatternSet, options: AttentionOptions) -> PatternSet:
    if options.cpu_causal_blocks:
        attention = dataclasses.replace(attention, patterns=tuple(
            dataclasses.replace(p, build=dataclasses.replace(p.build, cpu_causal_blocks=options.cpu_causal_blocks))
            for p in attention.patterns
        ))
    limit = options.cpu_min_score_bytes
    if limit == 0:
        return attention

    def gated(check: Any) -> Any:
        def check_size(match: Any) -> bool | str:
            verdict = check(match)
            if not verdict or isinstance(verdict, str) or match.val("q").device.type != "cpu":
                return verdict
            size = _score_bytes(match)
            return True if size >= limit else f"scores of {size} B under cpu_min_score_bytes = {limit}"

        return check_size

    patterns = tuple(dataclasses.replace(p, check=gated(p.check)) for p in attention.patterns)
    return dataclasses.replace(attention, patterns=patterns)


def attention_set() -> PatternSet:
    patterns = tuple(
        _make_pattern(scale_how, mask_how)
        for scale_how in ("mul", "div", "div_tensor", "none")
        for mask_how in ("masked_fill", "add", "none")
    )
    return PatternSet(
        "attention", patterns, "explicit attention math -> aten.scaled_dot_product_attention",
        requires=(aten._softmax, aten.softmax), options=AttentionOptions, configure=_configure,
    )
