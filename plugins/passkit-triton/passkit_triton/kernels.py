"""Own the Triton source of one fusion region: :func:`kernel_spec` turns a region into text.

Every kernel has the same frame. Program ``(i, j)`` covers ``BLOCK_M`` rows and ``BLOCK_N``
columns of the region's domain ``D`` (rows: every dimension but the last, flattened; columns:
the last). A row index is split into coordinates of ``D[:-1]``, and each input is read through
strides that the launcher passes at run time (0 where the input broadcasts), so contiguous,
transposed and broadcast inputs all work and every size is a kernel argument, never a constant.

Values are ``[BLOCK_M, BLOCK_N]`` blocks (``full``) or ``[BLOCK_M, 1]`` blocks (``row`` and
``flat``). A reduction kernel holds whole rows (``BLOCK_N >= N``, one column program), masks the
padding with the reduction's neutral element, and reduces along axis 1. Outputs are written
contiguously. Arithmetic on 16-bit floats runs in float32; ``dtype_policy = "keep"`` rounds each
op's result to its own dtype as eager does, ``"fp32"`` rounds only what is stored and explicit
casts (``x.to(torch.bfloat16)``), which are the program's meaning. bfloat16 is
rounded by ``_round_to_bf16`` (nearest, ties to even), so interpreted and compiled kernels agree.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.fx import GraphModule, Node

from passkit_triton.ops import REDUCTIONS, family_of, literal, triton_expression

__all__ = ["InputLoad", "KernelSpec", "kernel_spec"]

_TRITON_TYPES = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.bool: "tl.int1",
}
_NEUTRAL = {"sum": "0", "mean": "0", "var_mean": "0", "max": 'float("-inf")', "min": 'float("inf")'}


# Rounds float32 to the nearest bfloat16 (ties to even) and back, with the same bits in
# Triton's interpreter (whose own conversion truncates) as on a GPU. NaN stays NaN.
_PRELUDE = """import triton
import triton.language as tl


@triton.jit
def _round_to_bf16(v):
    bits = v.to(tl.uint32, bitcast=True)
    rounded = ((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16) << 16
    return tl.where(v != v, v, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _to_bf16(v):
    # From the bits, since the interpreter's own conversion also flushes subnormals to zero.
    # NaN becomes the quiet NaN: its payload may sit in the low bits that are dropped.
    bits = _round_to_bf16(v).to(tl.uint32, bitcast=True) >> 16
    return tl.where(v != v, 0x7FC0, bits).to(tl.uint16).to(tl.bfloat16, bitcast=True)
"""


@dataclass(frozen=True)
class InputLoad:
    """One way the kernel reads an input: which input, and broadcast to which kind of value."""

    input: int
    kind: str


@dataclass(frozen=True)
class KernelSpec:
    """Everything the launcher needs besides the tensors: the source and its argument layout."""

    source: str
    name: str
    rank: int
    loads: tuple[InputLoad, ...]
    outputs: tuple[tuple[str, torch.dtype], ...]
    has_reduction: bool


def _compute_type(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16):
        return "tl.float32"
    return _TRITON_TYPES[dtype]


def _value_dtype(node: Node) -> torch.dtype:
    value = node.meta["val"]
    return value[0].dtype if isinstance(value, (tuple, list)) else value.dtype


class _Writer:
    def __init__(self, gm: GraphModule, policy: Literal["keep", "fp32"], rank: int) -> None:
        self.gm = gm
        self.policy = policy
        self.rank = rank
        self.lines: list[str] = []
        self.names: dict[Node, str] = {}
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.loads: dict[tuple[int, str], str] = {}
        self.has_reduction = False
        self.counter = 0

    def fresh(self) -> str:
        # Names follow the region's op order, not node names, so equal regions share a source.
        self.counter += 1
        return f"v{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def rounded(self, text: str, dtype: torch.dtype, *, explicit: bool = False) -> str:
        # An explicit cast to a 16-bit float rounds under either policy: it is the program's meaning.
        keep = self.policy == "keep" or explicit
        cast = f"({text}).to({_compute_type(dtype)})"
        if keep and dtype == torch.bfloat16:
            cast = f"_round_to_bf16(({text}).to(tl.float32))"
        elif keep and dtype == torch.float16:
            cast = f"({text}).to(tl.float16).to(tl.float32)"
        return cast

    def operand(self, arg: Any, kind: str) -> str:
        if isinstance(arg, Node):
            if arg.op == "placeholder":
                return self.load(self.placeholders.index(arg), kind, arg)
            return self.names[arg]
        return literal(arg)

    def load(self, index: int, kind: str, node: Node) -> str:
        key = (index, kind)
        if key not in self.loads:
            name = f"x{index}_{kind}"
            offset = " + ".join([f"d{i} * in{index}_{kind}_s{i}" for i in range(self.rank - 1)] + ["rows * 0"])
            if kind == "full":
                offset += f" + cols * in{index}_full_s{self.rank - 1}"
                mask = "mask"
            else:
                mask = "rmask"
            dtype = node.meta["val"].dtype
            self.emit(f"{name} = tl.load(in{index} + ({offset}), mask={mask}, other=0).to({_compute_type(dtype)})")
            self.loads[key] = name
        return self.loads[key]

    def pointwise(self, node: Node) -> None:
        kind = node.meta["fusion_kind"]
        args = [self.operand(arg, kind) for arg in node.args]
        text = triton_expression(node, args)
        self.names[node] = name = self.fresh()
        explicit = family_of(node) == "cast"
        self.emit(f"{name} = {self.rounded(text, _value_dtype(node), explicit=explicit)}  # {node.target}")

    def reduction(self, node: Node) -> None:
        self.has_reduction = True
        how = REDUCTIONS[node.target]
        source = self.operand(node.args[0], "full")
        name = self.fresh()
        neutral = _NEUTRAL[how]
        masked = f"tl.where(mask, {source}, {neutral})"
        dtype = _value_dtype(node)
        if how in ("sum", "mean"):
            total = f"tl.sum({masked}, axis=1, keep_dims=True)"
            text = total if how == "sum" else f"{total} / N"
            self.emit(f"{name} = {self.rounded(text, dtype)}")
        elif how in ("max", "min"):
            self.emit(f"{name} = {self.rounded(f'tl.{how}({masked}, axis=1, keep_dims=True)', dtype)}")
        else:  # var_mean: the row is in registers, so the two-pass formula costs no extra reads
            correction = node.kwargs.get("correction", 1)
            correction = 1 if correction is None else correction
            self.emit(f"{name}_mean = tl.sum({masked}, axis=1, keep_dims=True) / N")
            self.emit(f"{name}_diff = tl.where(mask, {source} - {name}_mean, 0)")
            var = f"tl.sum({name}_diff * {name}_diff, axis=1, keep_dims=True) / (N - {literal(correction)})"
            self.emit(f"{name}_var = {self.rounded(var, dtype)}")
            self.emit(f"{name}_mean = {self.rounded(f'{name}_mean', dtype)}")
        self.names[node] = name

    def getitem(self, node: Node) -> None:
        source, index = node.args
        self.names[node] = f"{self.names[source]}_{'var' if index == 0 else 'mean'}"


def _signature(placeholder_count: int, loads: list[tuple[int, str]], outputs: int, rank: int) -> list[str]:
    args = [f"in{i}" for i in range(placeholder_count)] + [f"out{j}" for j in range(outputs)]
    args += ["M", "N"] + [f"size{i}" for i in range(rank - 1)]
    for index, kind in loads:
        count = rank if kind == "full" else rank - 1
        args += [f"in{index}_{kind}_s{i}" for i in range(count)]
    return args + ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"]


def kernel_spec(gm: GraphModule, *, rank: int, policy: Literal["keep", "fp32"]) -> KernelSpec:
    """Write the Triton kernel for a region submodule whose domain has ``rank`` dimensions (>= 1)."""
    writer = _Writer(gm, policy, rank)
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            writer.getitem(node)
        elif node.target in REDUCTIONS:
            writer.reduction(node)
        else:
            writer.pointwise(node)
    body = writer.lines
    outputs: list[tuple[str, torch.dtype]] = []
    stores = []
    for j, node in enumerate(output_node.args[0]):
        kind = node.meta["fusion_kind"]
        outputs.append((kind, _value_dtype(node)))
        value = writer.names[node]
        if outputs[-1][1] == torch.bfloat16:
            value = f"_to_bf16({value})"
        if kind == "full":
            stores.append(f"tl.store(out{j} + (rows * N + cols), {value}.to(out{j}.dtype.element_ty), mask=mask)")
        else:  # row values: only the first column program writes them
            stores.append(f"tl.store(out{j} + rows, {value}.to(out{j}.dtype.element_ty), mask=rmask & ((rows * 0 + pid_n) == 0))")
    loads = sorted(writer.loads)
    head = [
        "pid_n = tl.program_id(1)",
        "rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
        "cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
        "rmask = rows < M",
        "mask = rmask & (cols < N)",
        "rest = rows",
    ]
    for i in reversed(range(1, rank - 1)):
        head += [f"d{i} = rest % size{i}", f"rest = rest // size{i}"]
    if rank > 1:
        head.append("d0 = rest")
    placeholders = len(writer.placeholders)
    signature = _signature(placeholders, loads, len(outputs), rank)
    text = "\n".join(["    " + line for line in head] + body + ["    " + line for line in stores])
    name = "passkit_region"
    source = f"{_PRELUDE}\n\n@triton.jit\ndef {name}({', '.join(signature)}):\n{text}\n"
    return KernelSpec(
        source=source,
        name=name,
        rank=rank,
        loads=tuple(InputLoad(index, kind) for index, kind in loads),
        outputs=tuple(outputs),
        has_reduction=writer.has_reduction,
    )
