"""passkit: PyTorch's AOT training compiler as a pipeline of named passes, composed in TOML.

Users call ``compile``, ``backend``, ``aot_function``, ``aot_module``, ``export``, ``package`` and
``load_pipeline``, or mount a pipeline file in stock ``torch.compile`` with ``inductor_options``;
each takes a pipeline by name, as a ``.toml`` file, or as a dict with a file's keys whose steps
may hold a ``graph_pass`` object itself (a notebook's pass, no plugin needed); plugin authors use
``graph_pass``, ``hookimpl``, ``Program``, ``Fact``, ``StepContext`` and
``progress`` (events for progress callbacks, a long pass's heartbeat phrase). The torch-heavy entry points
import lazily so that ``import passkit`` (and the CLI) start fast.
"""

from __future__ import annotations

from typing import Any

from passkit.core import progress
from passkit.core.facts import Fact
from passkit.core.hookspecs import Application, StepContext, hookimpl
from passkit.core.pass_api import Pass, graph_pass
from passkit.core.program import Program
from passkit.errors import CaptureError, PassError, PasskitError, PipelineError, PluginError, VerificationError

__version__ = "0.1.0"

__all__ = [
    "Application",
    "CaptureError",
    "Fact",
    "Pass",
    "PassError",
    "PasskitError",
    "Pipeline",
    "PipelineError",
    "PluginError",
    "Program",
    "StepContext",
    "VerificationError",
    "aot_function",
    "aot_module",
    "backend",
    "compile",
    "export",
    "graph_pass",
    "hookimpl",
    "inductor_options",
    "load_pipeline",
    "package",
    "patterns",
    "progress",
    "reports",
    "__version__",
]

_LAZY = {
    "compile": "passkit.frontends.api",
    "backend": "passkit.frontends.api",
    "aot_function": "passkit.frontends.aot",
    "aot_module": "passkit.frontends.aot",
    "load_pipeline": "passkit.frontends.compiling",
    "export": "passkit.frontends.export",
    "package": "passkit.frontends.package",
    "Pipeline": "passkit.pipeline",
    "reports": "passkit.frontends.compile_options",
    "inductor_options": "passkit.frontends.inductor_slots",
}


def __getattr__(name: str) -> Any:
    if name == "patterns":  # the pattern-rewrite API imports torch, so it loads on first use
        import importlib

        return importlib.import_module("passkit.patterns")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'passkit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
