"""Own what ``torch.compile`` hands a passkit backend besides the graph: ``mode`` and ``options``.

``torch.compile(m, backend="passkit", mode=..., options={...})`` calls the backend as
``backend(gm, example_inputs, mode=..., options=...)`` (torch passes them only when set, and
never both). ``options`` holds ``pipeline`` and any ``[settings]`` key; ``mode`` is mapped onto
the codegen step: a codegen pass with a ``mode`` option receives it (``codegen.inductor``
forwards it to Inductor), and ``codegen.python`` has nothing to tune, so every mode runs the
same Python code there. This module also keeps every compile's report for ``passkit.reports()``
and turns Dynamo's silent fallback at its recompile limit into one warning per function.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any, Mapping

from passkit.errors import PasskitError

__all__ = [
    "MODES",
    "apply_mode",
    "split_options",
    "record_report",
    "reports",
    "warn_at_recompile_limit",
]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def split_options(options: Mapping[str, Any] | None, setting_names: list[str]) -> tuple[Any, dict[str, Any]]:
    """``options`` as ``(pipeline or None, settings)``; an unknown key is a one-line error.

    ``setting_names`` are the keys of the pipeline's settings model (plugins may add some).
    """
    options = dict(options or {})
    pipeline = options.pop("pipeline", None)
    for key in options:
        if key not in setting_names:
            raise PasskitError(
                f"passkit: torch.compile options: unknown key {key!r} (keys: pipeline, {', '.join(setting_names)})"
            )
    return pipeline, options


def apply_mode(pipeline: Any, mode: str | None) -> Any:
    """``pipeline`` with ``mode`` set on every codegen step whose pass takes a ``mode`` option."""
    if mode is None or mode == "default":
        return pipeline
    if mode not in MODES:
        raise PasskitError(f"passkit: torch.compile mode {mode!r} is not one of {', '.join(MODES)}")
    steps = []
    for step in pipeline.steps:
        options = step.options
        if step.pass_name.startswith("codegen.") and "mode" in type(options).model_fields:
            options = type(options).model_validate({**dict(options), "mode": mode})
            step = dataclasses.replace(step, options=options)
        steps.append(step)
    return dataclasses.replace(pipeline, steps=tuple(steps))


_REPORTS: list[Any] = []


def record_report(report: Any) -> None:
    """Keep ``report`` for ``passkit.reports()``."""
    _REPORTS.append(report)


def reports() -> list[Any]:
    """The reports of every passkit compile in this process, newest last."""
    return list(_REPORTS)


class _RecompileLimitWarning(logging.Filter):
    """Watch Dynamo's log for its recompile-limit message; warn once per function."""

    def __init__(self) -> None:
        super().__init__()
        self.warned: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if "hit config." in message and isinstance(record.args, tuple) and len(record.args) >= 3:
            limit_type, limit, function = record.args[:3]
            if function not in self.warned:
                self.warned.add(str(function))
                warnings.warn(
                    f"passkit: torch.compile hit torch._dynamo.config.{limit_type} ({limit}) for {function}; "
                    "from now on it runs eagerly, uncompiled (raise the limit, or let the changing sizes be dynamic)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return True


_WATCHER = _RecompileLimitWarning()


def warn_at_recompile_limit() -> None:
    """Install the recompile-limit watcher on Dynamo's logger (once)."""
    logger = logging.getLogger("torch._dynamo.convert_frame")
    if _WATCHER not in logger.filters:
        logger.addFilter(_WATCHER)
