"""Own a fuzz program as data: inputs, a list of op nodes, outputs; its source and its module.

Values are numbered: the inputs first (``x0``, ``x1``, ...), then one per node (``v2``, ...).
A node names its op (``passkit.fuzz.ops.OPS``) and the values it reads. Keeping the program as
data is what lets the reducer drop nodes and still print and run what is left.

``source()`` is a self-contained Python module: a ``Program`` module, the custom
``autograd.Function``s it calls, and ``factory()`` returning ``(module, example_inputs)``, the
contract of ``passkit run --model`` and ``passkit bisect --model``. ``build()`` executes it.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from dataclasses import dataclass
from typing import Any, Literal

from passkit.fuzz.ops import FUNCTIONS, OPS, WIDTH, Shape

__all__ = ["Input", "Node", "FuzzProgram", "Mode"]

Mode = Literal["training", "inference", "export"]


@dataclass(frozen=True)
class Input:
    shape: Shape
    requires_grad: bool = False


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[int, ...]  # value numbers: inputs first, then earlier nodes


@dataclass(frozen=True)
class FuzzProgram:
    """A random program: what it takes, what it does, what it returns, and how it is run."""

    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    mode: Mode = "training"
    dynamic: bool = False  # compiled with symbolic sizes
    seed: int = 0  # the example inputs' values

    def name(self, value: int) -> str:
        return f"x{value}" if value < len(self.inputs) else f"v{value}"

    @property
    def needs(self) -> set[str]:
        return {OPS[node.op].needs for node in self.nodes if OPS[node.op].needs}

    def used_ops(self) -> list[str]:
        return [node.op for node in self.nodes]

    def source(self) -> str:
        """The program as a Python module a person can read and run (``factory()``)."""
        lines = ["import torch", "import torch.nn.functional as F", "", ""]
        for function in sorted({OPS[node.op].function for node in self.nodes if OPS[node.op].function}):
            lines += [FUNCTIONS[function], ""]
        lines += ["class Program(torch.nn.Module):", "    def __init__(self):", "        super().__init__()"]
        needs = self.needs
        if "w" in needs:
            lines.append(f"        self.w = torch.nn.Parameter(torch.randn({WIDTH}, {WIDTH}))")
        if "bn" in needs:
            lines.append(f"        self.bn = torch.nn.BatchNorm1d({WIDTH})")
        if "buf" in needs:
            lines.append(f'        self.register_buffer("buf", torch.zeros({WIDTH}))')
        arguments = ", ".join(self.name(i) for i in range(len(self.inputs)))
        lines += ["", f"    def forward(self, {arguments}):"]
        for index, node in enumerate(self.nodes):
            value = len(self.inputs) + index
            call = OPS[node.op].template.format(*(self.name(a) for a in node.args))
            lines.append(f"        {self.name(value)} = {call}")
        returned = ", ".join(self.name(v) for v in self.outputs)
        lines += [f"        return ({returned},)", "", ""]
        lines += ["def factory():", f'    """{self.describe()}"""', f"    torch.manual_seed({self.seed})"]
        made = ", ".join(
            f"torch.randn({', '.join(map(str, x.shape))}{', requires_grad=True' if x.requires_grad and self.mode == 'training' else ''})"
            for x in self.inputs
        )
        lines += ["    model = Program()", f"    return model, ({made},)", ""]
        return "\n".join(lines)

    def describe(self) -> str:
        return f"mode {self.mode}{', dynamic shapes' if self.dynamic else ''}; {len(self.nodes)} op(s)"

    def build(self, module_name: str = "passkit_fuzz_program") -> tuple[Any, tuple[Any, ...]]:
        """A fresh module and its example inputs, made by running ``source()``."""
        module = types.ModuleType(module_name)
        module.__file__ = f"<{module_name}>"
        code = compile(self.source(), module.__file__, "exec")
        # Registered while it runs: a custom autograd.Function's class is looked up by module.
        sys.modules[module_name] = module
        exec(code, module.__dict__)  # noqa: S102 - our own generated program
        model, inputs = module.factory()
        if self.mode != "training":
            inputs = tuple(x.detach() for x in inputs)
        return model, inputs

    def without(self, dropped: set[int]) -> FuzzProgram | None:
        """The program with the nodes at positions ``dropped`` removed. A value that read a
        dropped node reads that node's first operand instead when its shape is the same, else is
        dropped too; outputs likewise (None when no output is left). Unused inputs go."""
        inputs = len(self.inputs)
        shapes = self.shapes()
        replace: dict[int, int | None] = {}
        nodes: list[tuple[int, Node]] = []
        for position, node in enumerate(self.nodes):
            value = inputs + position
            args = tuple(_follow(replace, a) for a in node.args)
            if position in dropped or any(a is None for a in args):
                first = args[0] if args else None
                replace[value] = first if first is not None and shapes[first] == shapes[value] else None
                continue
            nodes.append((value, Node(node.op, args)))  # type: ignore[arg-type]
        outputs = [_follow(replace, v) for v in self.outputs]
        kept_outputs = tuple(v for v in outputs if v is not None)
        if not kept_outputs:
            return None
        # Renumber: used inputs, then the kept nodes.
        used = {a for _, node in nodes for a in node.args} | set(kept_outputs)
        kept_inputs = [i for i in range(inputs) if i in used]
        if not kept_inputs:
            return None
        number = {old: new for new, old in enumerate(kept_inputs)}
        for offset, (old, _) in enumerate(nodes):
            number[old] = len(kept_inputs) + offset
        return dataclasses.replace(
            self,
            inputs=tuple(self.inputs[i] for i in kept_inputs),
            nodes=tuple(Node(node.op, tuple(number[a] for a in node.args)) for _, node in nodes),
            outputs=tuple(number[v] for v in kept_outputs),
        )

    def shapes(self) -> list[Shape]:
        """The shape of every value, inputs first."""
        shapes = [x.shape for x in self.inputs]
        for node in self.nodes:
            spec = OPS[node.op]
            first = shapes[node.args[0]]
            second = shapes[node.args[1]] if spec.arity > 1 else ()
            shapes.append(spec.shape(first, second))
        return shapes


def _follow(replace: dict[int, int | None], value: int) -> int | None:
    while value in replace:
        found = replace[value]
        if found is None:
            return None
        value = found
    return value
