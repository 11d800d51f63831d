"""Own finding in-place writes that autograd does not record, before ``functionalize`` hides them.

Under ``no_grad``, or through ``t.detach()``, an in-place op changes a tensor that requires grad
while its autograd history stays as it was: later uses send their gradient to the history of
the old value. The functional graph keeps only values: the new value is computed from the old
one in a region autograd cannot see through (``no_grad``, ``detach``), so ``joint`` would drop
those gradients. ``joint`` reproduces eager from the functional graph for one case: an input
whose every write is hidden and is not used with autograd between its first and last write (its
final value becomes a leaf whose gradient is added to the input's). For every other hidden write
to a tensor that autograd then uses, capture keeps the captured graph and ``joint``
differentiates that, with autograd seeing the writes as eager's does (``subclasses``).

The check runs the captured graph once on fake tensors with autograd on, and only for graphs
that write in place and contain a ``detach`` or a grad-mode switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["HIDDEN_MUTATION_ERROR", "HiddenWrites", "find_hidden_writes"]

HIDDEN_MUTATION_ERROR = (
    "passkit: node {node} writes in place to a tensor that requires grad where autograd does not "
    "record it (under no_grad or through .detach()), and the program then uses that tensor with "
    "autograd; eager's gradients for this cannot be reproduced from a functional graph: move the "
    'write out of the compiled function, or use on_error = "eager"'
)


@dataclass
class HiddenWrites:
    """Inputs whose every write is hidden from autograd (``joint`` treats them as ``no_grad`` writes),
    and the first hidden write no functional graph can follow, if any."""

    inputs: set[int] = field(default_factory=set)
    unfollowable: str | None = None

    def refuse(self) -> None:
        if self.unfollowable is not None:
            raise PasskitError(HIDDEN_MUTATION_ERROR.format(node=self.unfollowable))


def _writes(node: Node) -> bool:
    """In-place data writes; ``set_`` swaps storage, which ``functionalize`` checks itself."""
    name = str(getattr(node.target, "__name__", node.target)).split(".")[0]
    if name.startswith("set_"):
        return False
    if _torch.mutates(node):
        return True
    return node.op in ("call_function", "call_method") and name.endswith("_") and not name.startswith("_")


def _may_hide(gm: GraphModule) -> bool:
    nodes = list(gm.graph.nodes)
    switches = any("detach" in str(n.target) or "set_grad_enabled" in str(n.target) for n in nodes)
    return switches and any(_writes(n) for n in nodes)


class _Family:
    """Tensors that require grad and share one storage, once a hidden write reached them."""

    def __init__(self, node: Node, input_index: int | None, tracked_before: bool) -> None:
        self.first_write = node
        self.input_index = input_index
        self.tracked_write = tracked_before
        self.read_after = False  # used with autograd where the functional graph cannot follow
        self.pending_read = False  # used with autograd since the family's last hidden write


class _Watcher(torch.fx.Interpreter):
    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[Node, Any] = {}
        self.input_of_storage: dict[Any, int] = {}
        self.tracked: set[Any] = set()  # storages written where autograd records it
        self.families: dict[Any, _Family] = {}
        self.placeholder_index = 0

    def run_node(self, n: Node) -> Any:
        if n.op == "placeholder":
            value = super().run_node(n)
            if isinstance(value, torch.Tensor):
                self.input_of_storage.setdefault(_torch.storage_of(value), self.placeholder_index)
            self.placeholder_index += 1
        elif n.op != "output" and _writes(n):
            value = self._run_write(n)
        else:
            value = super().run_node(n)
            self._note_reads(n, value, written=set())
        self.values[n] = value
        return value

    def _run_write(self, n: Node) -> Any:
        storages = {_torch.storage_of(self.values[a]) for a in n.all_input_nodes if isinstance(self.values.get(a), torch.Tensor)}
        # Bases only: autograd regenerates a view's grad_fn after any write to its base, while a
        # base's grad_fn changes only when autograd records the write.
        watched = [
            (v, v.grad_fn, v._version)
            for v in self.values.values()
            if isinstance(v, torch.Tensor) and v.requires_grad and not v._is_view() and _torch.storage_of(v) in storages
        ]
        value = super().run_node(n)
        written = set()
        for tensor, grad_fn, version in watched:
            if tensor._version == version:
                continue  # an argument this node only read
            storage = _torch.storage_of(tensor)
            written.add(storage)
            family = self.families.get(storage)
            if tensor.grad_fn is not grad_fn:
                self.tracked.add(storage)
                if family is not None:
                    family.tracked_write = True
            elif family is None:  # new data, old history: hidden from autograd
                self.families[storage] = _Family(n, self.input_of_storage.get(storage), storage in self.tracked)
            elif family.pending_read:
                family.read_after = True  # used with autograd between two hidden writes
        for storage in written:
            if storage in self.families:
                self.families[storage].pending_read = False
        self._note_reads(n, value, written)
        return value

    def _note_reads(self, n: Node, value: Any, written: set[Any]) -> None:
        if not self.families:
            return
        outputs = value if isinstance(value, (tuple, list)) else [value]
        if n.op != "output" and not any(isinstance(v, torch.Tensor) and v.requires_grad for v in outputs):
            return  # no autograd use: detach, shapes, no_grad regions
        for arg in n.all_input_nodes:
            v = self.values.get(arg)
            if not isinstance(v, torch.Tensor) or not v.requires_grad or _torch.storage_of(v) in written:
                continue
            family = self.families.get(_torch.storage_of(v))
            if family is None:
                continue
            if family.input_index is None:
                family.read_after = True  # an intermediate used with autograd after a hidden write
            else:
                family.pending_read = True


def _non_leaf(value: Any, requires_grad: bool) -> Any:
    """An input as eager's callers pass activations: a non-leaf, which may be written in place."""
    if not (requires_grad and isinstance(value, torch.Tensor) and value.is_floating_point()):
        return value
    return value.detach().requires_grad_(True).clone()


def find_hidden_writes(gm: GraphModule, example_inputs: list[Any], requires_grad: list[bool], fake_mode: Any) -> HiddenWrites:
    """Inputs written only where autograd does not see, and the first hidden write ``joint`` cannot
    follow from the functional graph (capture then has it differentiate the captured graph)."""
    found = HiddenWrites()
    if not any(requires_grad) or not _may_hide(gm):
        return found
    with fake_mode, torch.enable_grad():
        args = [_non_leaf(x, rg) for x, rg in zip(example_inputs, requires_grad)]
        watcher = _Watcher(gm)
        try:
            watcher.run(*args)
        except Exception:  # noqa: BLE001 - eager raises too; functionalize reports the error
            return found
    for family in watcher.families.values():
        if family.read_after or (family.input_index is not None and family.tracked_write):
            found.unfollowable = found.unfollowable or family.first_write.name
        elif family.input_index is not None:
            found.inputs.add(family.input_index)
    return found
