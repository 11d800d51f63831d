"""Own the rule that a scalar value fills only a field of its own kind: no coercion between
boolean, integer, number (float) and string, in settings, step keys and pass options alike.

pydantic's lax mode turns ``true`` into ``1`` and ``"5"`` into ``5``; an options model a plugin
writes by hand is lax unless its author asked otherwise. This check runs before the model
validates, reads only the field annotations, and words the refusal as
``expected an integer, got a boolean (true)``. One widening is allowed: an integer fills a
number field (TOML ``1`` for a float option). Fields whose annotation names no scalar kind
(custom types, mappings, ``Any``) are left to the model.
"""

from __future__ import annotations

import collections.abc
import json
import types
import typing
from typing import Any, Callable, Iterable, Literal, Mapping

import pydantic

__all__ = ["scalar_mismatch", "toml_literal"]

_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)


def scalar_mismatch(
    model: type[pydantic.BaseModel], values: Mapping[str, Any], *, render: Callable[[Any], str] | None = None
) -> tuple[str, str] | None:
    """The first value of ``values`` whose scalar kind its field of ``model`` does not take, as
    (location suffix such as ``.tables[0]``, message), or None when every kind fits.

    Keys are matched by alias when a field has one. ``render`` writes the value given (TOML's
    spelling by default: ``true``, ``"5"``).
    """
    fields = {_input_key(name, info): info for name, info in model.model_fields.items()}
    for key, value in values.items():
        info = fields.get(key)
        if info is None:
            continue
        found = _mismatch(info.annotation, value, f".{key}", render or toml_literal)
        if found is not None:
            return found
    return None


def toml_literal(value: Any) -> str:
    """A scalar as a TOML file spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _input_key(name: str, info: Any) -> str:
    alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
    return alias or name


def _mismatch(annotation: Any, value: Any, where: str, render: Callable[[Any], str]) -> tuple[str, str] | None:
    given = _kind(value)
    if given is not None:
        kinds = _scalar_kinds(annotation)
        if not kinds or given in kinds or (given is int and float in kinds):
            return None
        expected = " or ".join(_KIND_NAMES[kind] for kind in (bool, int, float, str) if kind in kinds)
        return where, f"expected {expected}, got {_KIND_NAMES[given]} ({render(value)})"
    if isinstance(value, (list, tuple)):
        for index, item_annotation in _item_annotations(annotation, len(value)):
            found = _mismatch(item_annotation, value[index], f"{where}[{index}]", render)
            if found is not None:
                return found
    return None


def _kind(value: Any) -> type | None:
    for kind in (bool, int, float, str):  # bool first: True is an int to isinstance
        if isinstance(value, kind):
            return kind
    return None


def _scalar_kinds(annotation: Any) -> frozenset[type]:
    """The scalar kinds an annotation takes; empty when it takes anything else too (then the
    model alone decides)."""
    annotation = _unwrap(annotation)
    if annotation in _KIND_NAMES:
        return frozenset({annotation})
    origin = typing.get_origin(annotation)
    if origin is Literal:
        kinds = {_kind(value) for value in typing.get_args(annotation)}
        return frozenset(kinds) if None not in kinds else frozenset()
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        kinds: set[type] = set()
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            arg_kinds = _scalar_kinds(arg)
            if not arg_kinds:
                return frozenset()
            kinds |= arg_kinds
        return frozenset(kinds)
    return frozenset()


def _item_annotations(annotation: Any, length: int) -> Iterable[tuple[int, Any]]:
    """(index, annotation) for the items of a sequence field; nothing for other fields."""
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return list(enumerate(args))[:length]
    if origin in _SEQUENCES and args:
        return [(index, args[0]) for index in range(length)]
    return []


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation
