"""Own how a compiled callable is kept in a cache entry, and got back.

- a ``GraphModule``'s bound ``forward`` (what ``codegen.python`` produces) is stored as its
  graph module (with the code it and each region body print, checked again on load), only when
  every function its graphs call is found again by its module and name (``_reloads_faithfully``);
- any other callable with a ``passkit_cache_payload()`` method returning ``(loader, data)`` is
  stored as that pair, and loading calls ``loader(data)``;
- anything else has no cache form (``store_callable`` returns None): the program is not cached.

``passkit.cache.store`` explains why, and raises ``CorruptEntry`` for what fails to load.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.cache.entry import CorruptEntry

__all__ = ["store_callable", "load_callable"]


def _resolves_by_name(target: Any) -> bool:
    """Whether importing ``target``'s module and looking up its name gives ``target`` back (a
    higher-order op, ``invoke_subgraph`` calling a region's body: under ``torch.ops.higher_order``)."""
    if _torch.is_higher_order(target):
        return getattr(torch.ops.higher_order, target.name(), None) is target
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):
        return False
    names = [n for n in (getattr(target, "__qualname__", None), getattr(target, "__name__", None)) if isinstance(n, str)]
    if module.startswith("torch._ops."):  # an ATen operator: torch.ops.<namespace>.<op>[.<overload>]
        root: Any = getattr(torch.ops, module.split(".", 2)[2], None)
        names = names[1:]
    else:
        try:
            root = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - not importable means not storable
            return False
    for name in names:
        found = root
        try:
            for part in name.split("."):
                found = getattr(found, part)
        except AttributeError:
            continue
        if found is target:
            return True
    return False


def _reloads_faithfully(gm: GraphModule) -> bool:
    """Whether ``gm`` (and every submodule) is plain FX code over callables found by name."""
    for module in gm.modules():
        if not isinstance(module, GraphModule):
            return False
        for node in module.graph.nodes:
            if node.op == "call_function" and not _resolves_by_name(node.target):
                return False
    return True


def store_callable(fn: Callable[..., Any]) -> tuple[str, Any] | None:
    owner = getattr(fn, "__self__", None)
    if inspect.ismethod(fn) and isinstance(owner, GraphModule) and fn.__name__ == "forward":
        return ("graph_module", (owner, _torch.graph_codes(owner))) if _reloads_faithfully(owner) else None
    payload = getattr(fn, "passkit_cache_payload", None)
    if callable(payload):
        described = payload()
        if described is not None:
            loader, data = described
            return ("loader", (str(loader), data))
    return None


def load_callable(stored: tuple[str, Any]) -> Callable[..., Any]:
    kind, data = stored
    if kind == "graph_module":
        gm, codes = data
        # Rebuilt node by node, it and each region body in it must print the code that was compiled.
        if _torch.graph_codes(gm) != codes:
            raise CorruptEntry("a stored graph reloads to other code")
        return gm.forward
    if kind == "loader":
        loader, payload = data
        module_name, _, attr = loader.partition(":")
        return getattr(importlib.import_module(module_name), attr)(payload)
    raise CorruptEntry(f"unknown callable kind {kind!r}")
