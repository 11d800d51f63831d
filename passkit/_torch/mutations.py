"""Own which nodes and ops write into their arguments, and which values share memory.

Functionalization, Dynamo-graph capture, regions and the code generators all ask these questions
of a graph; torch answers them through operator schemas, storages and autograd's view metadata.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch._ops import OpOverload
from torch.fx import GraphModule
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["StorageWeakRef", "has_mutations", "is_multi_output_view", "mutates", "op_mutates", "storage_of", "writes_in_place"]


def mutates(node: torch.fx.Node) -> bool:
    """Whether ``node`` mutates an argument: an op with a mutable schema (in-place, out=), or a
    trailing-underscore tensor method."""
    if node.op == "call_method":
        return str(node.target).endswith("_")
    return node.op == "call_function" and op_mutates(node.target)


def writes_in_place(node: torch.fx.Node) -> bool:
    """Whether ``node`` of a Dynamo graph writes into its first argument: ``mutates``, or a
    trailing-underscore function (``torch.relu_``), an in-place operator (``x += y``, as
    ``operator.iadd``) or an item assignment (``x[i] = y``)."""
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (mutates(node) or (name.endswith("_") and not name.startswith("__"))
            or node.target is operator.setitem
            or (getattr(node.target, "__module__", "") == "_operator" and name.startswith("i")))


def op_mutates(op: Any) -> bool:
    """Whether ``op`` is an operator overload with a mutable schema (in-place, ``out=``)."""
    return isinstance(op, OpOverload) and op._schema.is_mutable


def has_mutations(gm: GraphModule) -> bool:
    """Whether any node of ``gm`` mutates an argument (see ``mutates``)."""
    return any(mutates(n) for n in gm.graph.nodes)


def storage_of(value: Any) -> Any:
    """A hashable handle on the storage of ``value`` (real or fake tensor); None for others, and
    for a sparse tensor, which has no storage (``EmbeddingBag(sparse=True)``'s gradient)."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return None
    return StorageWeakRef(value.untyped_storage())


def is_multi_output_view(value: Any) -> bool:
    """Whether autograd made ``value`` as one of several views (``unbind``, ``split``)."""
    if not isinstance(value, torch.Tensor) or not value._is_view():
        return False
    return torch._C._autograd._get_creation_meta(value) == torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE
