"""Outputs that are views (of an intermediate, of another output, of an input) train as in eager.

The runtime wrapper returns the base of a view of an intermediate from its
``autograd.Function`` and makes the view outside it, so in-place writes to the view work as in
eager; the view's gradient is then recovered from the base's. A view that reads one element of
its base twice (``expand``, overlapping ``unfold`` or ``as_strided`` windows) cannot have its
gradient recovered so: the base's gradient sums over the shared element, and gathering it back
gave every position the sum (``x.abs().expand(3, 4)``'s gradient was 3x eager's). Every case is
checked against eager and torch's own AOT path (``aot_eager``), through Dynamo and
``aot_function``, on both shipped training pipelines.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import passkit

PIPELINES = ["training-python", "training"]
ENTRIES = ["dynamo", "aot_function"]


def _conv_then_expand(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w).expand(3, 2, 3, 3)


def _cat_then_expand(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x * 2], dim=1).expand(5, 8)


def _pool_then_expand(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool2d(x, 2).expand(4, 2, 2, 2)


def _two_views_of_one_intermediate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x * 2
    return y.expand(3, 4), y.t()


def _intermediate_and_its_expand(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.sin()
    return y, y.expand(5, 4)


def _expand_and_a_slice_of_one_intermediate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.cos()
    return y.expand(2, 4), y[:, 1:]


# name -> (function, input shapes); every input requires grad.
PROGRAMS: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    # views that read an element twice
    "expand": (lambda x: x.abs().expand(3, 4), [(1, 4)]),
    "expand_new_dim": (lambda x: (x * x).expand(2, 3, 4), [(3, 4)]),
    "conv_then_expand": (_conv_then_expand, [(1, 1, 5, 5), (2, 1, 3, 3)]),
    "cat_then_expand": (_cat_then_expand, [(1, 4)]),
    "pool_then_expand": (_pool_then_expand, [(1, 2, 4, 4)]),
    "slice_then_expand": (lambda x: (x + 1)[:, :1].expand(3, 5), [(3, 4)]),
    "expand_then_slice": (lambda x: x.exp().expand(3, 4)[1:], [(1, 4)]),
    "unfold_overlapping": (lambda x: (x * 3).unfold(0, 3, 1), [(6,)]),
    "as_strided_overlapping": (lambda x: (x + 1).as_strided((3, 3), (1, 1)), [(6,)]),
    "broadcast_to": (lambda x: x.tanh().broadcast_to(2, 3), [(3,)]),
    # views that read each element at most once
    "slice": (lambda x: (x * 2)[1:], [(3, 4)]),
    "transpose": (lambda x: (x * 2).t(), [(3, 4)]),
    "as_strided": (lambda x: (x + 1).as_strided((2, 2), (1, 2), 1), [(6,)]),
    "view": (lambda x: (x * 2).view(-1), [(3, 4)]),
    "unsqueeze": (lambda x: (x * 2).unsqueeze(0), [(3, 4)]),
    "unfold_apart": (lambda x: (x * 3).unfold(0, 2, 2), [(6,)]),
    # several outputs over one intermediate
    "two_views_of_one_intermediate": (_two_views_of_one_intermediate, [(1, 4)]),
    "intermediate_and_its_expand": (_intermediate_and_its_expand, [(1, 4)]),
    "expand_and_a_slice": (_expand_and_a_slice_of_one_intermediate, [(1, 4)]),
    # outputs that view an input
    "expand_of_input": (lambda x: x.expand(3, 4), [(1, 4)]),
    "input_and_its_expand": (lambda x: (x, x.expand(2, 4), x * 2), [(1, 4)]),
    "transpose_of_input": (lambda x: (x.t(), x.sum()), [(3, 4)]),
}

# The Inductor pipeline compiles for seconds a graph: the cases that read an element twice, and one
# of each other kind.
INDUCTOR_PROGRAMS = ["expand", "conv_then_expand", "unfold_overlapping", "slice", "intermediate_and_its_expand",
                     "expand_and_a_slice", "input_and_its_expand"]


# torch 2.13's own AOT path gets these wrong (measured: gradients off by up to 4.9 and 2.25): its
# intermediate base stands in for a view whose windows overlap. passkit is held to eager's here.
TORCH_AOT_MISSES = {"unfold_overlapping", "as_strided_overlapping"}


def _compiled(fn: Callable[..., Any], entry: str, backend: Any) -> Callable[..., Any]:
    torch._dynamo.reset()
    if entry == "dynamo":
        return torch.compile(fn, backend=backend, fullgraph=True)
    return passkit.aot_function(fn, pipeline=backend)


def _train(fn: Callable[..., Any], shapes: list[tuple[int, ...]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The outputs and the inputs' gradients of one step, under a loss that weighs each position
    of each output differently (a gradient summed over the wrong positions shows)."""
    torch.manual_seed(0)
    inputs = [torch.randn(shape, requires_grad=True) for shape in shapes]
    out = fn(*inputs)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    loss = sum((o * torch.linspace(-1.0, 2.0, o.numel()).view(o.shape)).sum() * (k + 1) for k, o in enumerate(outs))
    loss.backward()
    grads = [x.grad for x in inputs]
    assert all(g is not None for g in grads)
    return [o.detach() for o in outs], grads  # type: ignore[return-value]


def _check(program: str, pipeline: str, entry: str) -> None:
    fn, shapes = PROGRAMS[program]
    expected = _train(fn, shapes)
    if program not in TORCH_AOT_MISSES:
        torch.testing.assert_close(_train(_compiled(fn, "dynamo", "aot_eager"), shapes), expected)
    backend = pipeline if entry == "aot_function" else passkit.backend(pipeline)
    outs, grads = _train(_compiled(fn, entry, backend), shapes)
    torch.testing.assert_close(outs, expected[0])
    if pipeline == "training-python":  # codegen.inductor lays out conv_then_expand's output afresh
        assert [o.stride() for o in outs] == [o.stride() for o in expected[0]]
    torch.testing.assert_close(grads, expected[1])


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_views_returned_train_as_eager_on_training_python(program: str, entry: str) -> None:
    _check(program, "training-python", entry)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("program", INDUCTOR_PROGRAMS)
def test_views_returned_train_as_eager_on_training(program: str, entry: str) -> None:
    _check(program, "training", entry)


def test_the_issues_expand_gets_eagers_gradient_exactly() -> None:
    # Issue 58's report: x.grad was [[9, -9, 9, -9]], three times eager's.
    x = torch.tensor([[1.0, -2.0, 3.0, -4.0]], requires_grad=True)
    passkit.aot_function(lambda t: t.abs().expand(3, 4), pipeline="training-python")(x).sum().backward()
    assert x.grad.tolist() == [[3.0, -3.0, 3.0, -3.0]]


def test_written_views_of_intermediates_still_backpropagate_as_in_eager() -> None:
    # The views read each element once keep returning their base from the Function: an in-place
    # write to them works as in eager (a view made inside an autograd.Function refuses it).
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2)[:, 1:].t()

    x = torch.randn(3, 4)
    eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    for f, inp in ((fn, eager_x), (passkit.aot_function(fn, pipeline="training-python"), compiled_x)):
        out = f(inp)
        out.mul_(torch.arange(out.numel(), dtype=out.dtype).view(out.shape))
        (out * out).sum().backward()
    torch.testing.assert_close(compiled_x.grad, eager_x.grad)


def _output_and_its_transpose(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x * 2
    return y, y.t()


# Dynamo compiles a graph for any size at the second size it sees: the views' geometry, recorded at
# capture, is then symbolic (an alias of an input or of another output made from it crashed:
# "SymIntArrayRef expected to contain only concrete integers").
RESIZED: dict[str, Callable[..., Any]] = {
    "transpose_of_input": lambda x: (x.t(), x.sin()),
    "expand_of_a_row_of_input": lambda x: x[:1].expand(3, -1),
    "output_and_its_transpose": _output_and_its_transpose,
    "expand_of_intermediate": lambda x: x.abs()[:1].expand(3, -1),
}


def _train_resized(fn: Callable[..., Any], rows: int) -> tuple[list[torch.Tensor], torch.Tensor, list[bool]]:
    torch.manual_seed(rows)
    x = torch.randn(rows, 2, requires_grad=True)
    out = fn(x)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    sum((o * torch.linspace(-1.0, 2.0, o.numel()).view(o.shape)).sum() for o in outs).backward()
    assert x.grad is not None
    return [o.detach() for o in outs], x.grad, [o._base is x for o in outs]


# One case on the Inductor pipeline: it compiles for seconds a graph.
RESIZED_CASES = [(program, "training-python") for program in RESIZED] + [("transpose_of_input", "training")]


@pytest.mark.parametrize(("program", "pipeline"), RESIZED_CASES)
def test_views_returned_train_as_eager_at_every_size(program: str, pipeline: str) -> None:
    fn = RESIZED[program]
    torch._dynamo.reset()
    reference = torch.compile(fn, backend="aot_eager")
    compiled = torch.compile(fn, backend=passkit.backend(pipeline))
    for rows in (3, 5, 7):
        expected = _train_resized(fn, rows)
        torch.testing.assert_close(_train_resized(reference, rows)[:2], expected[:2])
        actual = _train_resized(compiled, rows)
        torch.testing.assert_close(actual[:2], expected[:2])
        assert [o.stride() for o in actual[0]] == [o.stride() for o in expected[0]]
        assert actual[2] == expected[2]


def _view_of_written_input(x: torch.Tensor) -> torch.Tensor:
    # Found by `passkit fuzz`: under dynamic shapes the view came back as a copy.
    x.add_(x)
    return x[..., :2]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_view_of_a_written_input_shares_its_memory_under_dynamic_shapes(pipeline: str) -> None:
    torch._dynamo.reset()
    compiled = passkit.compile(_view_of_written_input, pipeline=pipeline, dynamic=True, cache="off")
    for rows in (3, 5):
        x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows))
        expected_input = x.clone()
        expected = _view_of_written_input(expected_input)
        with torch.no_grad():
            out = compiled(x)
        torch.testing.assert_close(out, expected)
        assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert (out.stride(), out.storage_offset()) == (expected.stride(), expected.storage_offset())
        out.zero_()  # a write through the returned view reaches the input, as in eager
        expected.zero_()
        torch.testing.assert_close(x, expected_input)


def _transpose_of_written_input(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x.t()


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_view_of_an_input_follows_where_the_input_starts_in_its_memory(pipeline: str) -> None:
    # Dynamo guards an input's sizes and strides, not its storage offset: the second call's
    # input is a view into a larger tensor. The returned view was made at the first call's
    # offset, 0: a wrong value (max |diff| 3.9 on training-python), where aot_eager is right.
    torch._dynamo.reset()
    compiled = passkit.compile(_transpose_of_written_input, pipeline=pipeline, cache="off")
    for x in (torch.randn(3, 4), torch.randn(10, 4)[2:5]):
        expected = _transpose_of_written_input(x.clone())
        with torch.no_grad():
            out = compiled(x)
        torch.testing.assert_close(out, expected)
        assert out.storage_offset() == x.storage_offset()
        assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
