"""Own pipeline files: their models, loading, ``extends`` overlays, provenance and contract checks.

``load_pipeline("training")`` or ``load_pipeline("my.toml")`` returns a fully validated
``Pipeline``; see docs/pipelines.md for every key of the file.
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
