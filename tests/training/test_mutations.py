"""Input mutations and aliasing: compiled training matches eager, through Dynamo and make_fx."""

from __future__ import annotations

import pytest
import torch

from training_harness import ENTRIES, run_and_compare


@pytest.fixture(params=ENTRIES)
def entry(request: pytest.FixtureRequest) -> str:
    torch._dynamo.reset()
    return request.param


def test_mutating_an_input_that_does_not_require_grad(entry: str) -> None:
    def fn(w, buf):
        buf.add_(1)
        return (w * buf).sin()

    run_and_compare(fn, lambda: [torch.randn(4, requires_grad=True), torch.randn(4)], entry, steps=2)


def test_mutating_a_non_leaf_that_requires_grad(entry: str) -> None:
    def fn(w, x):
        x.mul_(2)
        return (x * w).sum(0)

    def make():
        torch.manual_seed(0)
        w = torch.randn(3, requires_grad=True)
        base = torch.randn(2, 3, requires_grad=True)
        return [w, base * 1]

    eager_in, compiled_in = run_and_compare(fn, make, entry)
    assert eager_in[1].grad_fn is not None and compiled_in[1].grad_fn is not None


def test_mutating_several_inputs(entry: str) -> None:
    def fn(w, a, b):
        a.add_(w.detach())
        b.mul_(3)
        return w * a + b

    run_and_compare(fn, lambda: [torch.randn(5, requires_grad=True), torch.randn(5), torch.randn(5)], entry, steps=2)


def test_mutated_input_that_is_also_returned(entry: str) -> None:
    def fn(w, buf):
        buf.add_(2)
        return buf, w * buf

    eager_in, compiled_in = run_and_compare(fn, lambda: [torch.randn(3, requires_grad=True), torch.zeros(3)], entry)
    compiled = __import__("training_harness").compiled_with(entry, fn)
    buf = torch.zeros(3)
    out, _ = compiled(torch.randn(3, requires_grad=True), buf)
    assert out is buf


def test_mutation_under_no_grad_of_a_leaf_that_requires_grad(entry: str) -> None:
    def fn(w, x):
        with torch.no_grad():
            w.mul_(0.5)
        return (x @ w).tanh()

    run_and_compare(fn, lambda: [torch.randn(4, 4, requires_grad=True), torch.randn(2, 4)], entry, steps=2)


def test_metadata_mutation_of_an_input(entry: str) -> None:
    def fn(w, x):
        x.t_()
        return x @ w

    eager_in, compiled_in = run_and_compare(fn, lambda: [torch.randn(3, 4, requires_grad=True), torch.randn(3, 2)], entry)
    assert compiled_in[1].shape == (2, 3)


def test_output_that_is_a_view_of_an_input(entry: str) -> None:
    def fn(w, x):
        return x.view(-1), (w * 2).sum()

    def make():
        return [torch.randn(3, requires_grad=True), torch.randn(2, 3)]

    run_and_compare(fn, make, entry)
    compiled = __import__("training_harness").compiled_with(entry, fn)
    x = torch.randn(2, 3)
    out, _ = compiled(torch.randn(3, requires_grad=True), x)
    assert out._base is x


def test_output_that_is_a_view_of_an_input_requiring_grad(entry: str) -> None:
    def fn(x):
        return x.t(), x.sin()

    run_and_compare(fn, lambda: [torch.randn(2, 3, requires_grad=True)], entry)


def test_one_and_two_views_of_one_intermediate(entry: str) -> None:
    def fn(x):
        y = x * 2
        return y[0], y[1]

    run_and_compare(fn, lambda: [torch.randn(2, 3, requires_grad=True)], entry)
    compiled = __import__("training_harness").compiled_with(entry, fn)
    a, b = compiled(torch.randn(2, 3, requires_grad=True))
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_view_returned_with_its_base(entry: str) -> None:
    def fn(x):
        y = x.exp()
        return y, y.view(-1)

    run_and_compare(fn, lambda: [torch.randn(2, 3, requires_grad=True)], entry)
    compiled = __import__("training_harness").compiled_with(entry, fn)
    y, flat = compiled(torch.randn(2, 3, requires_grad=True))
    assert flat._base is y


def test_the_same_tensor_passed_twice(entry: str) -> None:
    def fn(a, b):
        return a * b + a

    compiled = __import__("training_harness").compiled_with(entry, fn)
    x_eager = torch.randn(4, requires_grad=True)
    x_compiled = x_eager.detach().clone().requires_grad_()
    fn(x_eager, x_eager).sum().backward()
    out = compiled(x_compiled, x_compiled)
    out.sum().backward()
    torch.testing.assert_close(x_compiled.grad, x_eager.grad)


def test_in_place_ops_on_intermediates_and_index_assignment(entry: str) -> None:
    def fn(x, w):
        y = x @ w
        y.add_(1.0)
        y[:, 0] = 7.0
        z = y.clone()
        z[1] += y[0]
        return z.sigmoid()

    run_and_compare(fn, lambda: [torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)], entry)


def test_outputs_mixing_grad_and_no_grad(entry: str) -> None:
    def fn(x, y):
        return x * 2, y + 1, (x * y).detach(), x.argmax()

    run_and_compare(fn, lambda: [torch.randn(4, requires_grad=True), torch.randn(4)], entry)


def test_no_input_requires_grad(entry: str) -> None:
    def fn(x, y):
        y.add_(x)
        return (x * y).relu()

    run_and_compare(fn, lambda: [torch.randn(4), torch.randn(4)], entry, steps=2)


def test_double_backward_is_a_clear_error(entry: str) -> None:
    compiled = __import__("training_harness").compiled_with(entry, lambda x: (x**3).sum())
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(Exception, match="double backward") as info:
        torch.autograd.grad(compiled(x), x, create_graph=True)
    assert str(info.value) == (
        "double backward through a passkit-compiled program is not supported; "
        "compute higher-order gradients in eager mode"
    )
    (first_order,) = torch.autograd.grad(compiled(x), x)
    torch.testing.assert_close(first_order, 3 * x.detach() ** 2)


def test_a_view_returned_with_its_base_can_be_modified_in_place(entry: str) -> None:
    def fn(x, w):
        y = x @ w
        return y, y.view(-1)

    harness = __import__("training_harness")
    compiled = harness.compiled_with(entry, fn)
    results = []
    for run in (fn, compiled):
        torch.manual_seed(0)
        x, w = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)
        base, flat = run(x, w)
        base.add_(1)  # the view sees it, and autograd accepts it, as in eager
        (base.sin().sum() + (flat * flat).sum()).backward()
        results.append((base.detach(), flat.detach(), w.grad))
    for expected, actual in zip(*results):
        torch.testing.assert_close(actual, expected)
