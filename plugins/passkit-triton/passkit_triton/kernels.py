"""Own the Triton source of one fusion region: :func:`kernel_spec` turns a region into text.

Every kernel has the same frame. Program ``(i, j)`` covers ``BLOCK_M`` rows and ``BLOCK_N``
columns of the region's domain ``D`` (rows: every dimension but the last, flattened; columns:
the last). A row index is split into coordinates of ``D[:-1]``, and each input is read through
strides that the launcher passes at run time (0 where the input broadcasts), so contiguous,
transposed and broadcast inputs all work and every size is a kernel argument, never a constant.

Values are ``[BLOCK_M, BLOCK_N]`` blocks (``full``) or ``[BLOCK_M, 1]`` blocks (``row`` and
``flat``). A reduction kernel comes in two forms. The *whole-row* form holds a row in one block
(``BLOCK_N >= N``, one column program), masks the padding with the reduction's neutral element
and reduces along axis 1. The *looped* form (``looped=True``, for rows longer than a block)
walks each row in ``BLOCK_N`` steps: one loop per reduction (two for ``var_mean``), recomputing
the reduction's pointwise prologue from the inputs, then one loop that computes and stores the
full-size outputs. ``wide=True`` computes offsets in int64, for tensors of 2**31 elements or more.

Max and min (``amax``, ``amin``, ``maximum``, ``relu``, ``clamp``) propagate NaN, as torch does;
Triton's ``tl.max`` and default ``tl.maximum`` drop it. A 0-d CPU tensor input (a scalar that
torch keeps on the CPU) is passed by value, not as a pointer. Outputs are written contiguously.
Arithmetic on 16-bit floats runs in float32; ``dtype_policy = "keep"`` rounds each op's result to
its own dtype as eager does, ``"fp32"`` rounds only what is stored and explicit casts
(``x.to(torch.bfloat16)``), which are the program's meaning. bfloat16 is rounded by
``_round_to_bf16`` (nearest, ties to even), so interpreted and compiled kernels agree.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.fx import GraphModule, Node

from passkit_triton.ops import NAN_RULE as _NAN
from passkit_triton.ops import REDUCTIONS, family_of, literal, triton_expression

__all__ = ["InputLoad", "KernelSpec", "kernel_spec", "scalar_inputs"]

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


def _nan_reduce(how: str, block: str) -> str:
    """A row's max or min that is NaN when the row holds one (``tl.max`` drops NaNs).

    Not ``tl.reduce`` with a NaN-propagating combine: Triton's interpreter un-patches
    ``triton.language`` after calling a combine function, so later reductions would fail there.
    """
    nans = f"tl.sum(tl.where({block} != {block}, 1, 0), axis=1, keep_dims=True)"
    return f"tl.where({nans} > 0, float(\"nan\"), tl.{how}({block}, axis=1, keep_dims=True))"



# _round_to_bf16 rounds float32 to the nearest bfloat16 (ties to even) and back, with the same
# bits in Triton's interpreter (whose own conversion truncates) as on a GPU. NaN stays NaN.
# _tanh: Cephes' tanhf (a polynomial below 0.625, accurate to float32 near 0, where
# 1 - 2/(exp(2x)+1) cancels), since libdevice's tanh does not run in the interpreter.
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


@triton.jit
def _tanh(v):
    x = v.to(tl.float32)
    z = x * x
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
             - 3.33332819422e-1) * z * x + x
    a = tl.abs(x)
    large = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    large = tl.where(x < 0, -large, large)
    return tl.where(a < 0.625, small, tl.where(a > 44.0, tl.where(x < 0, -1.0, 1.0), large))
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
    scalars: tuple[int, ...] = ()  # inputs passed by value (0-d CPU tensors)
    looped: bool = False
    wide: bool = False


def _compute_type(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16):
        return "tl.float32"
    return _TRITON_TYPES[dtype]


def _value_dtype(node: Node) -> torch.dtype:
    value = node.meta["val"]
    return value[0].dtype if isinstance(value, (tuple, list)) else value.dtype


def scalar_inputs(gm: GraphModule) -> tuple[int, ...]:
    """The region inputs that are 0-d CPU tensors beside other tensors: the kernel takes their
    value, not a pointer."""
    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    found = tuple(
        i for i, value in enumerate(values) if isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu"
    )
    # A region of CPU scalars only runs where they are (their memory says where to launch).
    return found if len(found) < sum(isinstance(value, torch.Tensor) for value in values) else ()


class _Writer:
    def __init__(self, gm: GraphModule, policy: Literal["keep", "fp32"], rank: int, scalars: tuple[int, ...]) -> None:
        self.gm = gm
        self.policy = policy
        self.rank = rank
        self.scalars = scalars
        self.lines: list[str] = []
        self.indent = 1
        self.names: dict[Any, str] = {}  # node -> name; also (input, kind) -> name for loads
        self.loop_defined: list[Any] | None = None  # what the open loop defined: gone when it closes
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.load_kinds: set[tuple[int, str]] = set()
        self.has_reduction = False
        self.counter = 0

    def fresh(self) -> str:
        # Names follow the region's op order, not node names, so equal regions share a source.
        self.counter += 1
        return f"v{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def define(self, key: Any, name: str) -> None:
        self.names[key] = name
        if self.loop_defined is not None:
            self.loop_defined.append(key)

    def open_loop(self, wide: bool) -> None:
        cols = "(off + tl.arange(0, BLOCK_N)[None, :])" + (".to(tl.int64)" if wide else "")
        self.emit("for off in range(0, N, BLOCK_N):")
        self.indent += 1
        self.emit(f"cols = {cols}")
        self.emit("mask = rmask & (cols < N)")
        self.loop_defined = []

    def close_loop(self) -> None:
        for key in self.loop_defined or ():
            del self.names[key]
        self.loop_defined = None
        self.indent -= 1

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
            return self.value(arg)
        return literal(arg)

    def load(self, index: int, kind: str, node: Node) -> str:
        dtype = node.meta["val"].dtype
        if index in self.scalars:
            key = (index, "scalar")
            if key not in self.names:
                ct = _compute_type(dtype)
                self.emit(f"x{index}_scalar = (tl.zeros([1, 1], {ct}) + in{index}).to({ct})")
                self.define(key, f"x{index}_scalar")
            return self.names[key]
        key = (index, kind)
        if key not in self.names:
            self.load_kinds.add(key)
            name = f"x{index}_{kind}"
            offset = " + ".join([f"d{i} * in{index}_{kind}_s{i}" for i in range(self.rank - 1)] + ["rows * 0"])
            if kind == "full":
                offset += f" + cols * in{index}_full_s{self.rank - 1}"
                mask = "mask"
            else:
                mask = "rmask"
            self.emit(f"{name} = tl.load(in{index} + ({offset}), mask={mask}, other=0).to({_compute_type(dtype)})")
            self.define(key, name)
        return self.names[key]

    def value(self, node: Node) -> str:
        """The name of ``node``'s value in the current scope, writing what it needs first."""
        if node not in self.names:
            if node.target is operator.getitem:
                source, index = node.args
                self.value(source)  # var_mean: both parts are defined together
                return f"{self.names[source]}_{'var' if index == 0 else 'mean'}"
            assert node.target not in REDUCTIONS, "a reduction is written before the values that use it"
            self.pointwise(node)
        if node.target is operator.getitem:
            source, index = node.args
            return f"{self.names[source]}_{'var' if index == 0 else 'mean'}"
        return self.names[node]

    def pointwise(self, node: Node) -> None:
        kind = node.meta["fusion_kind"]
        args = [self.operand(arg, kind) for arg in node.args]
        text = triton_expression(node, args)
        name = self.fresh()
        explicit = family_of(node) == "cast"
        self.emit(f"{name} = {self.rounded(text, _value_dtype(node), explicit=explicit)}  # {node.target}")
        self.define(node, name)

    def reduction(self, node: Node) -> None:
        self.has_reduction = True
        how = REDUCTIONS[node.target]
        source = self.operand(node.args[0], "full")
        name = self.fresh()
        masked = f"tl.where(mask, {source}, {_NEUTRAL[how]})"
        dtype = _value_dtype(node)
        if how in ("sum", "mean"):
            total = f"tl.sum({masked}, axis=1, keep_dims=True)"
            text = total if how == "sum" else f"{total} / N"
            self.emit(f"{name} = {self.rounded(text, dtype)}")
        elif how in ("max", "min"):
            self.emit(f"{name}_block = {masked}")
            self.emit(f"{name} = {self.rounded(_nan_reduce(how, f'{name}_block'), dtype)}")
        else:  # var_mean: the row is in registers, so the two-pass formula costs no extra reads
            self.emit(f"{name}_mean = tl.sum({masked}, axis=1, keep_dims=True) / N")
            self.emit(f"{name}_diff = tl.where(mask, {source} - {name}_mean, 0)")
            var = f"tl.sum({name}_diff * {name}_diff, axis=1, keep_dims=True) / (N - {_correction(node)})"
            self.emit(f"{name}_var = {self.rounded(var, dtype)}")
            self.emit(f"{name}_mean = {self.rounded(f'{name}_mean', dtype)}")
        self.names[node] = name

    def looped_reduction(self, node: Node, wide: bool) -> None:
        """One loop over the row per pass: accumulate block-wise, reduce the block at the end."""
        self.has_reduction = True
        how = REDUCTIONS[node.target]
        name = self.fresh()
        dtype = _value_dtype(node)
        source_dtype = _value_dtype(node.args[0]) if isinstance(node.args[0], Node) else dtype
        ct = _compute_type(source_dtype)
        passes = ["sum", "var"] if how == "var_mean" else [how]
        for step in passes:
            acc = f"{name}_{step}_acc"
            init = "0" if step in ("sum", "mean", "var") else _NEUTRAL[step]
            self.emit(f"{acc} = tl.full([BLOCK_M, BLOCK_N], {init}, {ct})")
            self.open_loop(wide)
            source = self.operand(node.args[0], "full")
            if step == "var":
                self.emit(f"diff = tl.where(mask, {source} - {name}_mean, 0)")
                self.emit(f"{acc} = {acc} + diff * diff")
            elif step in ("sum", "mean"):
                self.emit(f"{acc} = {acc} + tl.where(mask, {source}, 0)")
            else:
                combine = "maximum" if step == "max" else "minimum"
                self.emit(f"{acc} = tl.{combine}({acc}, tl.where(mask, {source}, {_NEUTRAL[step]}), {_NAN})")
            self.close_loop()
            if step in ("max", "min"):
                self.emit(f"{name} = {self.rounded(_nan_reduce(step, acc), dtype)}")
            elif step == "var":
                var = f"tl.sum({acc}, axis=1, keep_dims=True) / (N - {_correction(node)})"
                self.emit(f"{name}_var = {self.rounded(var, dtype)}")
                self.emit(f"{name}_mean = {self.rounded(f'{name}_mean', dtype)}")
            else:
                total = f"tl.sum({acc}, axis=1, keep_dims=True)"
                if how == "var_mean":
                    self.emit(f"{name}_mean = {total} / N")
                    continue
                self.emit(f"{name} = {self.rounded(total if how == 'sum' else f'{total} / N', dtype)}")
        self.names[node] = name


def _correction(node: Node) -> str:
    correction = node.kwargs.get("correction", 1)
    return literal(1 if correction is None else correction)


def _signature(writer: _Writer, loads: list[tuple[int, str]], outputs: int) -> list[str]:
    rank = writer.rank
    args = [f"in{i}" for i in range(len(writer.placeholders))] + [f"out{j}" for j in range(outputs)]
    args += ["M", "N"] + [f"size{i}" for i in range(rank - 1)]
    for index, kind in loads:
        count = rank if kind == "full" else rank - 1
        args += [f"in{index}_{kind}_s{i}" for i in range(count)]
    return args + ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"]


def _store(j: int, kind: str, value: str, looped: bool) -> str:
    if kind == "full":
        return f"tl.store(out{j} + (rows * N + cols), {value}.to(out{j}.dtype.element_ty), mask=mask)"
    # Row values: in the whole-row form only the first column program writes them.
    only_first = "rmask" if looped else "rmask & ((rows * 0 + pid_n) == 0)"
    return f"tl.store(out{j} + rows, {value}.to(out{j}.dtype.element_ty), mask={only_first})"


def kernel_spec(
    gm: GraphModule, *, rank: int, policy: Literal["keep", "fp32"], looped: bool = False, wide: bool = False
) -> KernelSpec:
    """Write the Triton kernel for a region submodule whose domain has ``rank`` dimensions (>= 1).

    ``looped`` walks rows in ``BLOCK_N`` steps (any row length, one column program); ``wide``
    indexes in int64.
    """
    writer = _Writer(gm, policy, rank, scalar_inputs(gm))
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    int64 = ".to(tl.int64)" if wide else ""
    writer.lines = [
        "    pid_n = tl.program_id(1)",
        f"    rows = tl.program_id(0){int64} * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
        "    rmask = rows < M",
        "    rest = rows",
    ]
    for i in reversed(range(1, rank - 1)):
        writer.lines += [f"    d{i} = rest % size{i}", f"    rest = rest // size{i}"]
    if rank > 1:
        writer.lines.append("    d0 = rest")
    if not looped:
        writer.emit(f"cols = pid_n{int64} * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]")
        writer.emit("mask = rmask & (cols < N)")
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if node.target in REDUCTIONS:
            writer.looped_reduction(node, wide) if looped else writer.reduction(node)
        elif not looped:
            writer.value(node)
    results = list(output_node.args[0])
    outputs = [(node.meta["fusion_kind"], _value_dtype(node)) for node in results]
    order = list(range(len(results)))
    if looped:  # row values first, then one loop that computes and stores the full-size outputs
        order.sort(key=lambda j: outputs[j][0] == "full")
    for j in order:
        if looped and outputs[j][0] == "full" and writer.loop_defined is None:
            writer.open_loop(wide)
        value = writer.value(results[j])
        if outputs[j][1] == torch.bfloat16:
            value = f"_to_bf16({value})"
        writer.emit(_store(j, outputs[j][0], value, looped))
    if writer.loop_defined is not None:
        writer.close_loop()
    loads = sorted(writer.load_kinds)
    signature = _signature(writer, loads, len(outputs))
    name = "passkit_region"
    scalar_names = [f"in{i}" for i in writer.scalars]
    decorator = f"@triton.jit(do_not_specialize={scalar_names!r})" if scalar_names else "@triton.jit"
    text = "\n".join(writer.lines)
    source = f"{_PRELUDE}\n\n{decorator}\ndef {name}({', '.join(signature)}):\n{text}\n"
    return KernelSpec(
        source=source,
        name=name,
        rank=rank,
        loads=tuple(InputLoad(index, kind) for index, kind in loads),
        outputs=tuple(outputs),
        has_reduction=writer.has_reduction,
        scalars=writer.scalars,
        looped=looped,
        wide=wide,
    )
