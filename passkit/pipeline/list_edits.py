"""Own list edits in overlays: ``keep.add = [...]`` / ``keep.remove = [...]`` on a list option.

An overlay that wants one more op in ``decompose.keep`` should not copy the ten shipped
entries. Writing ``[override.decompose] keep.add = ["aten.silu.default"]`` (TOML reads it as
``keep = {add = [...]}``) appends to the inherited list; ``keep.remove = [...]`` drops items.
Removes apply before adds; adding an item already present keeps it where it is; removing an
item that is not there is an error (it is usually a typo). Each item remembers the file that
added it, and ``passkit explain`` shows it.
"""

from __future__ import annotations

from typing import Any

from passkit.errors import PipelineError
from passkit.pipeline.messages import did_you_mean

__all__ = ["LIST_EDIT_KEYS", "is_list_edit", "edit_list", "item_origin_key"]

LIST_EDIT_KEYS = ("add", "remove")


def is_list_edit(value: Any, current: Any) -> bool:
    """Whether an override value edits the current list rather than replacing it."""
    return isinstance(value, dict) and isinstance(current, list)


def item_origin_key(key: str, index: int) -> str:
    """How a list item's origin is stored in ``Step.origin``: ``keep[3]``."""
    return f"{key}[{index}]"


def edit_list(
    current: list[Any], origins: list[str], edit: dict[str, Any], where: str, file: str
) -> tuple[list[Any], list[str]]:
    """Apply ``{add: [...], remove: [...]}`` to ``current`` (whose items came from ``origins``).

    Returns the new list and each item's origin. ``where`` (``x.toml: override.decompose.keep``)
    starts every error.
    """
    for key in edit:
        if key not in LIST_EDIT_KEYS:
            hint = did_you_mean(key, LIST_EDIT_KEYS) or "; use add or remove, or assign a whole new list"
            raise PipelineError(f"{where}.{key}: unknown list edit{hint}")
    lists = {}
    for key in LIST_EDIT_KEYS:
        value = edit.get(key, [])
        if not isinstance(value, list):
            raise PipelineError(f"{where}.{key}: expected a list of items")
        lists[key] = value
    for index, item in enumerate(lists["remove"]):
        if item not in current:
            shown = [str(value) for value in current]
            hint = did_you_mean(str(item), shown) if isinstance(item, str) else ""
            raise PipelineError(f"{where}.remove[{index}]: {item!r} is not in the list{hint}")
    kept = [(value, origin) for value, origin in zip(current, origins) if value not in lists["remove"]]
    for item in lists["add"]:
        if all(item != value for value, _ in kept):
            kept.append((item, file))
    return [value for value, _ in kept], [origin for _, origin in kept]
