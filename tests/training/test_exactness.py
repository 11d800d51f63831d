"""Silent wrong results found by running torch's AOT Autograd tests, each pinned against eager.

Each test names where the math changed: a decomposition, the joint trace or the runtime.
"""

from __future__ import annotations

import copy

import pytest
import torch

import passkit

PIPELINE = "training-python"


def _grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    out = fn(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    return out, grad


def test_decomposition_before_joint_keeps_the_ops_own_gradient_log_ndtr() -> None:
    # Differentiating log_ndtr's decomposition (a where over two branches) gave NaN at -10.
    x = torch.tensor([-10.0, -3.0, 0.5, 12.0])
    fn = torch.special.log_ndtr
    expected, expected_grad = _grad(fn, x)
    out, grad = _grad(passkit.aot_function(fn, pipeline=PIPELINE), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert not grad.isnan().any()


def _inductor_ops_pipeline(tmp_path) -> str:
    """``training``'s lowering (Inductor's table before ``joint``), ending in plain ATen calls."""
    pipeline = tmp_path / "inductor-ops.toml"
    pipeline.write_text(
        '[pipeline]\nname = "inductor-ops"\n\n[[steps]]\npass = "functionalize"\n\n'
        '[[steps]]\npass = "decompose"\ntables = ["inductor"]\n\n[[steps]]\npass = "joint"\n\n'
        '[[steps]]\npass = "partition.default"\n\n[[steps]]\npass = "codegen.python"\n'
    )
    return str(pipeline)


def test_a_decomposition_joint_applies_keeps_the_layout_main_recorded(tmp_path) -> None:
    # Inductor's ``cat`` of an empty past and one tensor returns that tensor with its own
    # (transposed) strides where ``cat`` returns a contiguous one; the ``view`` main recorded
    # after it was valid only for the contiguous layout (GPT-2 with an empty key cache).
    pipeline = _inductor_ops_pipeline(tmp_path)

    def fn(x: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([torch.zeros(2, 4, 0, 8), x.transpose(1, 2)], -2)
        return (keys.transpose(-2, -1) * 0.5).reshape(8, 8, 12)

    x = torch.randn(2, 12, 4, 8)
    expected, expected_grad = _grad(fn, x)
    out, grad = _grad(passkit.aot_function(fn, pipeline=pipeline), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.skipif(not hasattr(torch.nn.functional, "linear_cross_entropy"), reason="torch 2.13's op")
def test_a_backward_that_writes_with_out_traces_through_inductors_table(tmp_path) -> None:
    # linear_cross_entropy's chunked backward calls ``torch.mm(..., out=logits)``; the joint's
    # plain trace handed ``mm.out`` to Inductor's ``mm`` decomposition, which takes no ``out``.
    weight, target = torch.randn(5, 3), torch.tensor([1, 4, 0, 2])

    def fn(x: torch.Tensor) -> torch.Tensor:
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)
        return torch.nn.functional.linear_cross_entropy(x, weight, target, reduction="none", options=options)

    x = torch.randn(4, 3)
    expected, expected_grad = _grad(fn, x)
    out, grad = _grad(passkit.aot_function(fn, pipeline=_inductor_ops_pipeline(tmp_path)), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)


def test_decomposition_before_joint_keeps_safe_softmax_gradient() -> None:
    x = torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]])
    fn = lambda t: torch.ops.aten._safe_softmax.default(t, -1) * 2  # noqa: E731
    expected, expected_grad = _grad(fn, x)
    out, grad = _grad(passkit.aot_function(fn, pipeline=PIPELINE), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)


def test_decomposition_before_joint_keeps_kl_div_gradient() -> None:
    target = torch.tensor([0.0, 0.5, 0.5])
    fn = lambda t: torch.nn.functional.kl_div(t, target, reduction="batchmean")  # noqa: E731
    x = torch.tensor([-1.0, -2.0, -0.5])
    _, expected_grad = _grad(fn, x)
    _, grad = _grad(passkit.aot_function(fn, pipeline=PIPELINE), x)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: torch.nn.functional.rrelu(x, training=True), id="rrelu"),
        pytest.param(lambda x: torch.bernoulli(torch.sigmoid(x)) * x, id="bernoulli"),
        pytest.param(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), id="dropout"),
        # Eager fills dropout's mask in place in the transposed layout of its input.
        pytest.param(
            lambda x: torch.nn.functional.dropout(x.view(8, 8).t(), 0.5, training=True).reshape(64),
            id="dropout-transposed",
        ),
        pytest.param(lambda x: torch.bernoulli(x.detach().view(8, 8).t(), 0.5).reshape(64) * x, id="bernoulli-p-transposed"),
    ],
)
def test_random_ops_draw_what_eager_draws_under_the_same_seed(fn) -> None:
    # rrelu's noise buffer was read before the joint trace's functionalized write (garbage
    # gradients); bernoulli's decomposition draws through rand_like instead of the same kernel.
    x = torch.randn(64)
    torch.manual_seed(7)
    expected, expected_grad = _grad(fn, x)
    compiled = passkit.aot_function(fn, pipeline=PIPELINE)
    compiled(x)  # compile first: tracing draws nothing, but keep the seeded call clean
    torch.manual_seed(7)
    out, grad = _grad(compiled, x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_transformer_layer_with_dropout_in_training_matches_eager_gradients(kind: str, batch_first: bool) -> None:
    # Dropout after self-attention draws its mask in place into a transposed activation's layout;
    # functionalized as ``bernoulli.p`` it filled a contiguous tensor instead: other elements.
    torch.manual_seed(0)
    layer_type = torch.nn.TransformerEncoderLayer if kind == "encoder" else torch.nn.TransformerDecoderLayer
    layer = layer_type(8, 2, dim_feedforward=16, batch_first=batch_first)
    compiled_layer = passkit.aot_module(__import__("copy").deepcopy(layer), pipeline=PIPELINE)
    x = torch.randn(2, 3, 8) if batch_first else torch.randn(3, 2, 8)
    args = (x,) if kind == "encoder" else (x, torch.randn_like(x))
    compiled_layer(*args)  # compile outside the seeded step
    torch.manual_seed(1)
    expected = layer(*args)
    expected.sum().backward()
    torch.manual_seed(1)
    out = compiled_layer(*args)
    out.sum().backward()
    torch.testing.assert_close(out, expected)
    for (name, p), q in zip(layer.named_parameters(), compiled_layer.mod.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}: {m}")


def test_runtime_regenerates_view_as_complex_in_its_dtype() -> None:
    x = torch.randn(3, 2, requires_grad=True)
    out = passkit.aot_function(torch.view_as_complex, pipeline=PIPELINE)(x)
    assert out.dtype == torch.complex64 and out._base is x
    torch.testing.assert_close(out, torch.view_as_complex(x))
    out.abs().sum().backward()
    expected = x.detach().clone().requires_grad_(True)
    torch.view_as_complex(expected).abs().sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)


def test_runtime_keeps_a_detached_alias_out_of_autograd_and_in_step_with_mutation() -> None:
    def fn(a):
        tmp = a.detach()
        a.mul_(2)
        return a, tmp

    root = torch.ones(3, 3, requires_grad=True)
    a, tmp = passkit.aot_function(fn, pipeline=PIPELINE)(root.clone())
    assert a.requires_grad and not tmp.requires_grad
    torch.testing.assert_close(tmp, torch.full((3, 3), 2.0))
    a.mul_(3)
    torch.testing.assert_close(tmp, torch.full((3, 3), 6.0))  # still a's memory


# Outputs without a gradient (running statistics written back) get no zero tensor from autograd;
# a differentiable output that the loss does not use gets zeros from the runtime instead.
@pytest.mark.parametrize("pipeline", ["training-python", "training"])
def test_an_unused_output_beside_updated_running_statistics_gets_zero_gradient(pipeline: str) -> None:
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    twin = type(eager)(*(copy.deepcopy(m) for m in eager))

    def both(model, x):
        out = model(x)
        return out.tanh(), out.exp()

    compiled = passkit.compile(lambda x: both(twin, x), pipeline=pipeline)
    x = torch.randn(4, 8)
    used, unused = compiled(x)
    expected_used, expected_unused = both(eager, x)
    torch.testing.assert_close(unused, expected_unused)
    used.sum().backward()
    expected_used.sum().backward()
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(twin[1].running_mean, eager[1].running_mean)


def test_output_made_to_require_grad_by_the_function_does() -> None:
    def fn(a, b):
        view = a.view(-1)
        view.requires_grad_(True)
        return view

    out = passkit.aot_function(fn, pipeline=PIPELINE)(torch.ones(3, 3), torch.ones(3, 3, requires_grad=True))
    assert out.requires_grad and out.is_leaf


def test_complex_outputs_keep_requires_grad_and_gradients() -> None:
    fn = lambda x: torch.fft.rfft(x)  # noqa: E731
    x = torch.randn(8, requires_grad=True)
    out = passkit.aot_function(fn, pipeline=PIPELINE)(x)
    assert out.requires_grad
    out.abs().sum().backward()
    expected = x.detach().clone().requires_grad_(True)
    fn(expected).abs().sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)


class _HalfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


def test_custom_autograd_function_keeps_its_own_backward() -> None:
    # The backward halves the gradient; differentiating the forward (x * 1) would give ones.
    compiled = passkit.aot_function(lambda x: _HalfGrad.apply(x), pipeline=PIPELINE)
    x = torch.ones(3, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 0.5))


def test_mutated_input_overlapping_another_input_is_refused() -> None:
    def fn(a, b):
        a.add_(1)
        return a + b

    compiled = passkit.aot_function(fn, pipeline=PIPELINE)
    compiled(torch.ones(2), torch.ones(2))  # distinct memory: fine
    base = torch.ones(4, 2)
    with pytest.raises(passkit.PasskitError) as info:
        compiled(base[0], base[0])
    assert str(info.value) == (
        "passkit: inputs 0 and 1 share memory (views of one tensor) and the program writes to input 0; "
        "pass the base tensor once, or clone the views before the call"
    )
    torch.testing.assert_close(base, torch.ones(4, 2))  # refused before anything was written


def test_overlapping_views_are_refused_after_clean_calls_of_the_same_program() -> None:
    # A clean call is remembered by where the inputs start; other starts are checked again.
    def fn(a, b):
        a.add_(1)
        return a + b

    compiled = passkit.aot_function(fn, pipeline=PIPELINE)
    a, b = torch.ones(4), torch.ones(4)
    for _ in range(2):
        compiled(a, b)
    base = torch.ones(8)
    with pytest.raises(passkit.PasskitError, match="inputs 0 and 1 share memory"):
        compiled(base[0:4], base[2:6])
    torch.testing.assert_close(base, torch.ones(8))
    torch.testing.assert_close(a, torch.full((4,), 3.0))


def test_mutated_input_sharing_storage_without_overlap_runs() -> None:
    def fn(a, b):
        a.mul_(2)
        return a + b

    base = torch.ones(2, 2)
    out = passkit.aot_function(fn, pipeline=PIPELINE)(base[0], base[1])
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    torch.testing.assert_close(base, torch.tensor([[2.0, 2.0], [1.0, 1.0]]))


def test_linalg_ops_with_effectful_error_checks_compile_and_still_check() -> None:
    # Their error check is an effectful op; tracing wrapped it in an effect token nobody passed.
    compiled = passkit.aot_function(torch.linalg.inv, pipeline=PIPELINE)
    x = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    expected, expected_grad = _grad(torch.linalg.inv, x)
    out, grad = _grad(compiled, x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)
    with pytest.raises(torch.linalg.LinAlgError):
        compiled(torch.zeros(2, 2, requires_grad=True))


def test_lstm_trains_and_matches_eager() -> None:
    # oneDNN's fused layer fills its backward's workspace only under grad mode.
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 3, batch_first=True)
    compiled = passkit.aot_module(__import__("copy").deepcopy(lstm), pipeline=PIPELINE)
    x = torch.randn(2, 5, 4)
    expected, _ = lstm(x)
    out, _ = compiled(x)
    torch.testing.assert_close(out, expected)
    expected.sum().backward()
    out.sum().backward()
    for p, q in zip(lstm.parameters(), compiled.mod.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def test_data_dependent_output_size_compiles_and_matches_eager() -> None:
    # masked_select's size is an unbacked symbol; the refusals left are in
    # tests/frontends/test_data_dependent.py.
    fn = lambda x: torch.masked_select(x, x > 0) * 2  # noqa: E731
    compiled = passkit.aot_function(fn, pipeline=PIPELINE)
    for x in (torch.tensor([1.0, -1.0, 2.0]), torch.tensor([-1.0, 3.0, -2.0])):
        expected, expected_grad = _grad(fn, x)
        out, grad = _grad(compiled, x)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grad, expected_grad)


def test_values_overwritten_by_copy_get_a_zero_gradient_as_in_eager() -> None:
    # matrix_power(x, 0) copies eye into a clone of x: eager's copy_ formula gives x zeros, the
    # functional copy gave no path at all (None).
    fn = lambda x: torch.linalg.matrix_power(x, 0)  # noqa: E731
    x = torch.randn(3, 3)
    expected, expected_grad = _grad(fn, x)
    out, grad = _grad(passkit.aot_function(fn, pipeline=PIPELINE), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert grad is not None and not grad.any()


def test_matmul_of_a_batch_and_a_vector_gives_eagers_vector_gradient() -> None:
    # Lowered to (mat * vec).sum(1), mv's backward summed 250 products in another order than
    # eager's BLAS kernel: 5.7e-5 off, outside torch.testing's float32 tolerance. `training-python`
    # keeps mv, as aot_eager does. Not `training`: Inductor's own table lowers mv the same way,
    # and torch.compile(backend="inductor") is as far from eager here (6e-4).
    torch.manual_seed(7)
    # OpInfo's sample values (make_tensor: uniform in [-9, 9]); under this seed the lowered sum's
    # error (3.7e-4) is outside the tolerance, as in the OpInfo sample
    a = (torch.rand(5, 5, 10, 10) * 18 - 9).requires_grad_(True)
    b = (torch.rand(10) * 18 - 9).requires_grad_(True)
    grad_out = torch.rand(5, 5, 10) * 18 - 9
    expected = torch.autograd.grad(torch.matmul(a, b), (a, b), grad_out)
    compiled = passkit.aot_function(torch.matmul, pipeline=PIPELINE)
    torch.testing.assert_close(torch.autograd.grad(compiled(a, b), (a, b), grad_out), expected)
