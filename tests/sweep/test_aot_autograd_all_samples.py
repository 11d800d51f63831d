"""torch's own ``aot_autograd_check`` through passkit, over every sample of the entries it once missed.

``torch.testing._internal.optests.aot_autograd_check`` compares eager with the compiled program
under one seed (``wrapper_set_seed``), outputs and gradients at torch.testing's default
tolerances. Here its compiler is ``passkit.aot_function`` with ``training-python``. The project's
sweep takes only the first sample of each entry; these entries differed on later ones (random
draws, gradients, batch norm's running statistics), through a compile-cache entry: unpickling a
graph re-traced it symbolically, which ran a random op on a factory's output once and kept the
draw as a constant, and dropped the node values that tell the runtime to keep the old running
statistics for the backward. So every sample runs twice: compiled cold, then again through the
cache that the first pass filled.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.testing._internal.optests.aot_autograd as optests_aot
from torch.testing._internal.common_methods_invocations import op_db

import passkit

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

PIPELINE = "training-python"

ENTRIES = [
    # outputs: random draws must be eager's under the same seed
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.fractional_max_pool3d",
    "nn.functional.scaled_dot_product_attention",
    # gradients at torch.testing's default float32 tolerance
    "matmul",
    "__rmatmul__",
    "pca_lowrank",
    # batch norm, mutating its running statistics
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_batch_norm_with_update",
    "nn.functional.batch_norm",
    # every sample, fast enough to run cold and from the cache in one test
    "nn.functional.max_pool2d",
]


def _entry(name: str) -> Any:
    return next(op for op in op_db if op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") == name)


def _check_every_sample(op: Any) -> list[str]:
    failures = []
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=True)):
        try:
            optests_aot.aot_autograd_check(
                op.op, (sample.input, *sample.args), sample.kwargs, dynamic=False, check_gradients=True
            )
        except Exception as exc:  # noqa: BLE001 - collect every sample's verdict, then report them all
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            detail = " ".join(line.strip() for line in str(cause).splitlines() if "difference" in line or "modified" in line)
            failures.append(f"sample {i}: {type(exc).__name__}: {str(exc).splitlines()[0]} {detail}".strip())
    return failures


@pytest.mark.parametrize("name", ENTRIES)
def test_every_sample_matches_eager_compiled_and_from_the_cache(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        optests_aot, "compiled_function", lambda fn, *args, **kwargs: passkit.aot_function(fn, pipeline=PIPELINE)
    )
    op = _entry(name)
    assert _check_every_sample(op) == [], "compiled"
    assert _check_every_sample(op) == [], "loaded from the compile cache"
