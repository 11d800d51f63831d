"""The docs' tanh-GELU tolerance examples hold for the approximation they describe.

A user copies ``tolerance=(rtol, atol)`` from docs/writing-passes.md ("Declare a tolerance") and
docs/patterns.md into a pass that swaps exact GELU for its tanh form; on an ordinary model (unit-
scale activations) that pass must then pass the numerics check, not report a mismatch.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from passkit.verify.compare import compare_values

DOCS = Path(__file__).resolve().parents[2] / "docs"
TOLERANCE = re.compile(r"tolerance=\(([0-9.e-]+), ([0-9.e-]+)\)")


def _doc_tolerances(name: str) -> list[tuple[float, float]]:
    found = [(float(r), float(a)) for r, a in TOLERANCE.findall((DOCS / name).read_text())]
    assert found, f"{name} shows no tolerance=(rtol, atol) example"
    return found


def _tanh_gelu_comparison(tolerance: tuple[float, float]):
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    return compare_values([F.gelu(x)], [F.gelu(x, approximate="tanh")], "outputs", tolerance)


@pytest.mark.parametrize("doc", ["writing-passes.md", "patterns.md"])
def test_the_docs_tanh_gelu_tolerance_accepts_the_approximation_at_unit_scale(doc: str) -> None:
    for tolerance in _doc_tolerances(doc):
        assert _tanh_gelu_comparison(tolerance).mismatches == [], tolerance


def test_the_old_example_tolerance_would_have_rejected_it() -> None:
    (mismatch,) = _tanh_gelu_comparison((1e-3, 1e-4)).mismatches
    assert mismatch.why == "max |diff| 0.000474"
