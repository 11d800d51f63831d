"""Own pipeline files: their models, loading, ``extends`` overlays, provenance and contract checks.

``load_pipeline("training", registry=...)`` or ``load_pipeline("my.toml", registry=...)``
returns a fully validated ``Pipeline``; ``passkit.load_pipeline`` supplies the process-wide
registry. See docs/pipelines.md for every key of the file. This package never imports torch or
a built-in pass.
"""

from __future__ import annotations

from passkit.pipeline.contracts import check_contracts, step_applies
from passkit.pipeline.loader import is_pipeline_name, load_pipeline
from passkit.pipeline.model import Pipeline, Settings, Step

__all__ = [
    "Pipeline",
    "Settings",
    "Step",
    "check_contracts",
    "is_pipeline_name",
    "load_pipeline",
    "step_applies",
]
