"""Which torch release runs: the flags every version branch in ``passkit/_torch`` reads, and the
range pyproject.toml declares (installing next to a torch outside it is pip's error, not ours)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch

from passkit._torch import versions

REPO = Path(__file__).resolve().parents[2]


def test_a_release_is_read_from_torchs_version_string() -> None:
    assert versions.torch_release("2.15.0+cu132") == (2, 15)
    assert versions.torch_release("2.13.0+cpu") == (2, 13)
    assert versions.torch_release("2.16.0.dev20261201") == (2, 16)
    assert versions.torch_release("2.14.0rc1") == (2, 14)


def test_the_flags_name_the_release_that_runs() -> None:
    release = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    assert versions.TORCH_VERSION == torch.__version__
    assert versions.TORCH_2_14 == (release >= (2, 14))
    assert versions.TORCH_2_15 == (release >= (2, 15))
    assert versions.SUPPORTED_TORCH[0] <= release < versions.SUPPORTED_TORCH[1]


def test_the_declared_range_is_the_supported_one() -> None:
    (low, high) = versions.SUPPORTED_TORCH
    expected = f"torch>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    for pyproject in [REPO / "pyproject.toml", REPO / "plugins/passkit-triton/pyproject.toml"]:
        dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        assert [d for d in dependencies if d.startswith("torch")] == [expected], pyproject
