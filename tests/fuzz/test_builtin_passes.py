"""CI's fuzzing: every built-in pass alone, a fixed seed, a few programs each, compared with eager.

Bounded in time: a handful of programs per pass (two for ``codegen.inductor``, whose C++ kernels
take seconds each to build); ``benchmarks/fuzz.py`` runs many more. A difference fails with its
minimal program, first bad step and reproducer (``passkit.testing.fuzz_pass``).
"""

from __future__ import annotations

import pytest

from passkit.core.registry import get_registry
from passkit.testing import fuzz_pass

pytestmark = pytest.mark.slow

# Built-in passes that fuzz programs cannot reach: collectives need a process group, and the
# edge.* steps take an Edge-dialect program that only passkit.to_executorch makes (the fuzzer's
# modes are training, inference and export; tests/frontends/test_executorch.py covers them).
NOT_REACHED = {"collectives.bucket", "collectives.overlap", "collectives.reshard", "edge.lower", "edge.contiguous", "edge.delegate"}
PROGRAMS = {"codegen.inductor": 2}
BASE = {"codegen.inductor": "training"}


def builtin_passes() -> list[str]:
    return sorted(
        name for name, entry in get_registry().passes.items()
        if entry.distribution == "passkit" and name not in NOT_REACHED
    )


def test_every_builtin_pass_but_the_collectives_and_edge_steps_is_fuzzed() -> None:
    assert {"functionalize", "decompose", "joint", "partition.default", "fx.cse", "codegen.python"} <= set(builtin_passes())


@pytest.mark.parametrize("pass_name", builtin_passes())
def test_builtin_pass_agrees_with_eager_on_random_programs(pass_name: str, tmp_path) -> None:
    summary = fuzz_pass(pass_name, programs=PROGRAMS.get(pass_name, 6), pipeline=BASE.get(pass_name, "training-python"),
                        seed=58, out=tmp_path)
    assert summary.generated == PROGRAMS.get(pass_name, 6)
