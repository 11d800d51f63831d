"""Own writing a resolved pipeline back as a TOML file that ``passkit.load_pipeline`` reads.

The file is self-contained: no ``extends``, every step with its id, pass, ``when`` and every
option value, and every setting. Reproducers store the resolved pipeline this way, and
``passkit bisect`` writes its minimal pipeline this way. Options without a TOML form (``None``)
are left out, so they take their default when the file is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import pydantic_core
import tomli_w

if TYPE_CHECKING:
    from passkit.pipeline import Pipeline, Step

__all__ = ["pipeline_toml"]


def _options(options: Any) -> dict[str, Any]:
    """Option values as TOML-able data; values without a JSON form become their ``repr``."""
    return pydantic_core.to_jsonable_python(options.model_dump(), fallback=repr)


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(v) for v in value if v is not None]
    return value


def pipeline_toml(
    pipeline: Pipeline,
    *,
    steps: Iterable[Step] | None = None,
    name: str | None = None,
    description: str | None = None,
    comment: str = "",
    **settings: Any,
) -> str:
    """``pipeline`` (or only ``steps`` of it) as TOML text; ``settings`` override its settings."""
    chosen = list(pipeline.steps if steps is None else steps)
    document: dict[str, Any] = {
        "pipeline": {
            "name": name or pipeline.name,
            "description": description if description is not None else pipeline.description,
            **({"kind": pipeline.kind} if pipeline.kind != "compile" else {}),
        },
        "settings": _without_none({**pipeline.settings.model_dump(mode="json"), **settings}),
    }
    parts = ["".join(f"# {line}\n" for line in comment.splitlines()) + tomli_w.dumps(document)]
    for step in chosen:
        entry: dict[str, Any] = {"pass": step.pass_name, "id": step.id}
        if step.when is not None:
            entry["when"] = step.when
        if not step.enabled:
            entry["enabled"] = False
        entry.update(_without_none(_options(step.options)))
        if any(isinstance(value, dict) for value in entry.values()):
            parts.append(tomli_w.dumps({"steps": [entry]}))  # nested tables only have an inline form here
        else:
            parts.append("[[steps]]\n" + tomli_w.dumps(entry))
    return "\n".join(parts)
