"""gemm on Hugging Face Llama at its defaults (SDPA attention, grouped k/v heads, no biases).

The zoo's Llama (tests/models/zoo.py: only sizes made small) goes through ``passkit.compile``
with ``fx.cse`` and the ``gemm`` set after ``decompose``: q/k/v become one product, gate/up
another, and the loss and every gradient equal eager's.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import passkit

sys.path.insert(0, str(Path(__file__).parents[2] / "models"))
from zoo import ZOO  # noqa: E402

from dependencies import require_module  # noqa: E402

pytestmark = pytest.mark.slow


def test_llama_at_its_defaults_fuses_projections_with_eager_numerics(tmp_path) -> None:
    require_module("transformers")
    llama = next(z for z in ZOO if z.name == "llama")
    torch.manual_seed(0)
    eager = llama.build()
    assert eager.config._attn_implementation == "sdpa"
    twin = copy.deepcopy(eager)
    path = tmp_path / "gemm.toml"
    path.write_text(
        '[pipeline]\nname = "gemm"\nextends = "training-python"\n\n'
        '[[steps]]\nid = "pre_cse"\npass = "fx.cse"\nafter = "decompose"\n\n'
        '[[steps]]\npass = "rewrite"\npatterns = ["gemm"]\nexpect_match = true\nafter = "pre_cse"\n'
    )
    compiled = passkit.compile(twin, pipeline=str(path))
    torch.manual_seed(1)
    inputs = llama.inputs(2)
    expected = eager(**inputs).loss
    actual = compiled(**inputs).loss
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    expected.backward()
    actual.backward()
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    (report,) = compiled.passkit_reports
    record = next(r for r in report.records if r.id == "rewrite")
    # One layer: q/k/v (k and v narrower: grouped heads) as one product, gate/up as another.
    assert record.stats["applied"] == {"gemm:mm_x3": 1, "gemm:mm_x2": 1}
    assert record.stats["stage"] == "pre-grad"
