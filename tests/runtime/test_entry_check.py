"""Values compiled code cannot read never reach it: a compiled function called inside another
compile is traced through, and a fake, meta or subclass tensor, or one on another device, is
refused in one line that names the input and the step."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import passkit
from passkit import _torch
from passkit.frontends.api import compile_program, load_pipeline
from passkit.frontends.capture import program_from_function
from passkit.runtime.entry_check import EntryCheck, EntryError


def _sin_twice(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin()


@pytest.mark.parametrize("pipeline", ["training", "training-python"])
def test_a_compiled_function_called_inside_another_compile_is_traced_through(pipeline: str) -> None:
    # PyTorch's test_compilation_context: the inner program's kernels would read the outer
    # trace's fake tensors (a segmentation fault on codegen.inductor).
    inner = passkit.aot_function(_sin_twice, pipeline=pipeline)
    x = torch.randn(5, requires_grad=True)
    inner(x)  # compiled first, on real tensors
    outer = passkit.aot_function(lambda t: inner(t) * 3, pipeline=pipeline)
    y = outer(x)
    expected = _sin_twice(x) * 3
    torch.testing.assert_close(y, expected)
    (grad,) = torch.autograd.grad(y.sum(), x)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(grad, expected_grad)
    assert len(outer.passkit_reports) == 1 and len(inner.passkit_reports) == 1


def _compiled_sin_twice() -> passkit.runtime.wrapper.CompiledProgram:
    x = torch.randn(5)
    program = program_from_function(lambda t: (_sin_twice(t),), [x])
    return compile_program(program, [x], load_pipeline("inference"))


def _fake() -> torch.Tensor:
    return _torch.new_fake_mode().from_tensor(torch.randn(5))


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (_fake, "a fake tensor, which compiled code cannot read; call the compiled program on real tensors, outside any trace"),
        (lambda: torch.randn(5, device="meta"), "a meta tensor, which compiled code cannot read; call it on tensors with data"),
        (
            lambda: TwoTensor(torch.randn(5), torch.randn(5)),
            "a TwoTensor, a tensor subclass, which compiled code cannot read; "
            "compile the program with this kind of input, so that passkit flattens it",
        ),
    ],
    ids=["fake", "meta", "subclass"],
)
def test_compiled_code_refuses_values_it_cannot_read(make, problem: str) -> None:
    compiled = _compiled_sin_twice()
    with pytest.raises(EntryError) as raised:
        compiled(make())
    assert str(raised.value).endswith(f"steps[5] (codegen.inductor): input 0 (arg0_1) is {problem}")
    torch.testing.assert_close(compiled(torch.ones(5))[0], _sin_twice(torch.ones(5)))


def test_a_tensor_on_another_device_is_refused_by_name() -> None:
    # A GPU program's check, made on this CPU with a fake CUDA example.
    with _torch.new_fake_mode():
        example = torch.empty(5, device="cuda")
    check = EntryCheck(["x"], [example], "gpu.toml: steps[4] (codegen.inductor)")
    with pytest.raises(EntryError) as raised:
        check([torch.randn(5)])
    assert str(raised.value) == (
        "gpu.toml: steps[4] (codegen.inductor): input 0 (x) is on cpu, but the code was compiled for cuda:0; "
        "move it there, or compile for cpu"
    )
