"""``codegen.inductor``'s GPU path, checked on this CPU: what a forward and its backward share
for CUDA graphs, and failures that name the toolchain that failed."""

from __future__ import annotations

import pytest
import torch

import passkit
from passkit.passes.codegen_inductor import inductor_fallback_message


def test_a_forward_and_its_backward_share_one_cudagraphs_switch(monkeypatch) -> None:
    # torch's compile_fx gives both one BoxedBool: a forward that cannot be recorded turns
    # recording off for its backward too (else the backward re-records every step).
    from torch._inductor import compile_fx

    seen: list[tuple[bool, object, object]] = []
    real = compile_fx.compile_fx_inner

    def recording(gm, example_inputs, **kwargs):
        seen.append((kwargs["is_backward"], kwargs["cudagraphs"], kwargs["boxed_forward_device_index"]))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording)
    compiled = passkit.aot_function(lambda x: (x * 3).sin(), pipeline="training", cache="off")
    x = torch.randn(8, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * (x * 3).cos().detach())
    (forward, fw_box, fw_index), (backward, bw_box, bw_index) = seen
    assert (forward, backward) == (False, True)
    assert fw_box is bw_box and fw_index is bw_index


class _TritonFailure(Exception):
    """Stands for an exception raised inside the triton package."""


_TritonFailure.__module__ = "triton.compiler.errors"


def _cpp_failure() -> Exception:
    from torch._inductor.exc import CppCompileError

    return CppCompileError(["g++", "kernel.cpp"], "kernel.cpp:3: error: expected ';'")


@pytest.mark.parametrize(
    ("make", "building_on", "advice"),
    [
        (_cpp_failure, None, "needs no C++ compiler"),
        (lambda: _TritonFailure("PassManager::run failed"), None, "needs no Triton"),
        (lambda: RuntimeError("worker died"), "cuda", "needs no Triton"),
        (lambda: RuntimeError("worker died"), "cpu", "needs no C++ compiler"),
        (lambda: AssertionError("bernoulli_ lowering"), None, "runs the graph as ATen calls, without Inductor"),
    ],
    ids=["cpp", "triton", "build-on-cuda", "build-on-cpu", "lowering"],
)
def test_an_inductor_failure_names_the_toolchain_that_failed(make, building_on, advice) -> None:
    exc = make()
    wrapped = RuntimeError("compile failed")
    wrapped.__cause__ = exc
    message = inductor_fallback_message("forward", True, wrapped, building_on=building_on)
    assert message == (
        "Inductor cannot compile the 'forward' graph (RuntimeError: compile failed); "
        f"use the 'training-python' pipeline, which {advice}"
    )
