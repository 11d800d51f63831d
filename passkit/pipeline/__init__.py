"""Own pipeline files and dicts: their models, loading, ``extends`` overlays, provenance,
contract checks and how a resolved plan explains itself.

``load_pipeline("training", registry=...)``, ``load_pipeline("my.toml", registry=...)`` or
``load_pipeline({...}, registry=...)`` (a dict with a file's keys, whose steps may name ``Pass``
objects; ``dicts``) returns a fully validated ``Pipeline``; ``passkit.load_pipeline`` supplies
the process-wide registry. See docs/pipelines.md for every key of the file. This package never
imports torch or a built-in pass.
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
