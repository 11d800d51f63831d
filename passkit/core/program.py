"""Own ``Program``: the state that every pass transforms.

A program holds named FX graphs, a signature that describes every graph input and output with
a descriptor (so passes never count positions), fake example inputs, the set of established
facts, and after code generation one compiled callable per graph.

Graph names are fixed: ``main`` before the joint step, ``joint`` after it, ``forward`` and
``backward`` after partitioning.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

if TYPE_CHECKING:
    from torch.fx import GraphModule


__all__ = ["Desc", "GraphIO", "InputInfo", "OutputInfo", "SubclassInfo", "Signature", "TargetOpset", "Program"]

DescKind = Literal["param", "buffer", "user", "tangent", "mutation", "grad", "saved"]


@dataclass(frozen=True)
class Desc:
    """What one graph input or output is.

    Inputs are ``param``, ``buffer``, ``user`` (index: position in the program's inputs) or
    ``tangent`` (index: position of the graph output it is the cotangent of, in ``main``'s
    outputs). Outputs are ``user`` (index: the user output), ``mutation`` and ``grad``
    (index: the program input) or ``saved`` (index: ordinal among saved values).
    """

    kind: DescKind
    index: int

    def __str__(self) -> str:
        return f"{self.kind}[{self.index}]"


@dataclass
class GraphIO:
    """The descriptors of one graph's placeholders and outputs, in order."""

    inputs: list[Desc]
    outputs: list[Desc]

    @property
    def n_visible(self) -> int:
        """How many leading outputs the caller sees (``user`` and ``mutation``); saved values follow."""
        return sum(1 for d in self.outputs if d.kind in ("mutation", "user"))


@dataclass
class InputInfo:
    """One input of the compiled callable, with the mutations the program makes to it."""

    name: str
    kind: Literal["param", "buffer", "user"]
    is_tensor: bool = True
    requires_grad: bool = False
    is_leaf: bool = True
    mutates_data: bool = False
    mutates_metadata: bool = False
    mutated_under_no_grad: bool = False

    @property
    def mutated(self) -> bool:
        return self.mutates_data or self.mutates_metadata


@dataclass
class OutputInfo:
    """One user output of the compiled callable, with what is needed to regenerate aliases."""

    is_tensor: bool = True
    requires_grad: bool = False
    alias_of_input: int | None = None
    is_input: bool = False
    alias_of_output: int | None = None
    # size, stride, storage offset; a symbolic one (any size) is its sympy expression, whose
    # symbols ``view_symbols`` (``_torch.SymbolSource``s) say where to read in a call's inputs
    view: tuple[tuple[Any, ...], tuple[Any, ...], Any] | None = None
    view_symbols: tuple[Any, ...] = ()
    multi_output_view: bool = False  # made by ``unbind``/``split``: autograd forbids writing to it
    detached: bool = False  # shares an input's memory without being its view (``detach()``)
    # An autograd.Function's result (perhaps viewed after) that shares an input's memory: made
    # inside the runtime's Function, so its gradient passes the Function's backward (made from the
    # input outside it, it would skip that backward; torch's ``custom_function_view``).
    made_by_function: bool = False


@dataclass(frozen=True)
class SubclassInfo:
    """A tensor subclass the caller passes or gets, flattened by ``flatten_subclasses``.

    ``position`` is its place among the caller's inputs (or outputs), ``flat`` the positions of
    its plain inner tensors among the program's inputs (or ``main``'s user outputs), and
    ``layout`` what it is built of, e.g. ``TwoTensor(a, b)``.
    """

    position: int
    layout: str
    flat: tuple[int, ...]


@dataclass
class Signature:
    """The callable's interface and every graph's descriptors.

    ``inputs`` and ``outputs`` are plain tensors; the subclasses the caller sees are recorded in
    ``subclass_inputs`` and ``subclass_outputs``.
    """

    inputs: list[InputInfo]
    outputs: list[OutputInfo]
    graph_io: dict[str, GraphIO] = field(default_factory=dict)
    subclass_inputs: list[SubclassInfo] = field(default_factory=list)
    subclass_outputs: list[SubclassInfo] = field(default_factory=list)


@dataclass(frozen=True)
class TargetOpset:
    """What a ``decompose`` step lowered the program to.

    The names (``tables``, ``keep``, ``extra``) identify it and are what serialises; ``table``
    is the resolved decomposition table (``joint`` lowers the backward through it) and
    ``kept`` the overloads left whole.
    """

    tables: tuple[str, ...]
    keep: tuple[str, ...]
    extra: tuple[str, ...]
    table: Mapping[Any, Callable[..., Any]] = field(default_factory=dict, compare=False, repr=False)
    kept: frozenset[Any] = field(default=frozenset(), compare=False, repr=False)


@dataclass
class Program:
    """Named FX graphs plus their signature, fake example inputs, facts and compiled code."""

    graphs: dict[str, GraphModule]
    signature: Signature
    example_inputs: list[Any]
    fake_mode: Any = None
    facts: set[str] = field(default_factory=set)
    compiled: dict[str, Callable[..., Any]] = field(default_factory=dict)
    training: bool = False
    target_opset: TargetOpset | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    _hash_cache: Any = field(default=None, repr=False, compare=False)

    def record_stat(self, key: str, value: Any) -> None:
        """Attach a figure to the current step's report row (for example saved bytes)."""
        self.stats[key] = value

    def io(self, graph: str) -> GraphIO:
        return self.signature.graph_io[graph]

    def set_graph(self, name: str, gm: GraphModule, io: GraphIO) -> None:
        """Install ``gm`` under ``name`` with its descriptors."""
        self.graphs[name] = gm
        self.signature.graph_io[name] = io

    def drop_graph(self, name: str) -> None:
        self.graphs.pop(name, None)
        self.signature.graph_io.pop(name, None)
        self.compiled.pop(name, None)

    def node_count(self) -> int:
        return sum(len(gm.graph.nodes) for gm in self.graphs.values())

    def graph_hash(self) -> str:
        """Hash of every graph's generated code: how the runner decides a step changed things.

        Subgraphs (a higher-order op's ``get_attr`` submodules) count too. Cached on the
        identity of each graph's code string, which ``recompile`` replaces.
        """
        codes = [
            (f"{name}/{path}" if path else name, module.code)
            for name in sorted(self.graphs)
            for path, module in self.graphs[name].named_modules()
            if hasattr(module, "graph")  # a GraphModule; program.py imports no torch
        ]
        cached = self._hash_cache
        if cached is not None and len(cached[0]) == len(codes) and all(
            old_name == name and old_code is code for (old_name, old_code), (name, code) in zip(cached[0], codes)
        ):
            return cached[1]
        digest = hashlib.sha256()
        for name, code in codes:
            digest.update(name.encode())
            digest.update(code.encode())
        self._hash_cache = (codes, digest.hexdigest())
        return self._hash_cache[1]


