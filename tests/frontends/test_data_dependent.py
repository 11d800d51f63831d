"""Data-dependent sizes (unbacked symbols from ``nonzero``, ``masked_select``, ``.item()``) flow
through every stage, as torch's AOT path carries them; what stays out of reach is one line.

Each program is compared with eager, outputs and gradients (those Dynamo captures also with
``torch.compile(backend="aot_eager")``), on calls whose data-dependent sizes differ from the first
call's: one compile serves them all, the sizes are symbols, not guards.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
from torch import nn

from dependencies import require_module

import passkit
from passkit.frontends.data_dependent import DATA_DEPENDENT_ERROR, DATA_DEPENDENT_GUARD_ERROR

TRAINING = ["training-python", "training"]
CLOSE = {"rtol": 1e-5, "atol": 1e-5}  # Inductor's fused sums round in another order

PARTITIONERS = """
[pipeline]
name = "dd-{partition}"
extends = "training-python"
disable = ["partition.default"]

[settings]
verify = "numerics"

[[steps]]
id = "cut"
pass = "{partition}"
after = "joint"
"""

REINPLACE = """
[pipeline]
name = "dd-reinplace"
extends = "inference-python"

[[steps]]
pass = "reinplace"
after = "fx.dce"
"""


@pytest.fixture(autouse=True)
def data_dependent_capture() -> Any:
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        yield
    torch._dynamo.reset()


class MoE(nn.Module):
    """Token routing as MoE layers write it: each expert takes the rows routed to it."""

    def __init__(self, d: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.gate(x).softmax(-1)
        weight, idx = scores.max(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows = torch.nonzero(idx == i).squeeze(-1)
            out = out.index_add(0, rows, expert(x[rows]) * weight[rows, None])
        return out


def _masked_exp_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.masked_select(x, x > 0).exp().sum()


def _item_sized(x: torch.Tensor) -> torch.Tensor:
    n = (x > 0).sum().item()
    return x.new_ones(n).sum() * x.square().sum()


def _run_module(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    for p in model.parameters():
        p.grad = None
    out = model(x)
    out.square().sum().backward()
    return out.detach(), [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _run_function(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.detach().clone().requires_grad_(True)
    out = fn(leaf)
    out.sum().backward()
    return out.detach(), leaf.grad


def _moe_batches() -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(32, 16), torch.randn(24, 16), torch.randn(32, 16) * 3]


def _programs(backend: Any) -> int:
    return len(backend.programs)


@pytest.mark.parametrize("pipeline", TRAINING)
def test_moe_routing_trains_like_eager_and_aot_eager(pipeline: str) -> None:
    torch.manual_seed(0)
    model = MoE()
    twin, reference = copy.deepcopy(model), copy.deepcopy(model)
    backend = passkit.backend(pipeline=pipeline, cache="off")
    compiled = torch.compile(twin, backend=backend, fullgraph=True)
    aot_eager = torch.compile(reference, backend="aot_eager", fullgraph=True)
    for x in _moe_batches():
        expected, expected_grads = _run_module(model, x)
        out, grads = _run_module(compiled, x)
        torch.testing.assert_close(out, expected, **CLOSE)
        torch.testing.assert_close(grads, expected_grads, **CLOSE)
        torch.testing.assert_close((out, grads), _run_module(aot_eager, x), **CLOSE)
    # The rows per expert differ on every batch; the symbols cover them. Static and then
    # symbolic batch sizes give Dynamo's two graphs at most.
    assert 1 <= _programs(backend) <= 2


@pytest.mark.parametrize("pipeline", TRAINING)
@pytest.mark.parametrize("fn", [_masked_exp_sum, _item_sized], ids=["masked_select", "item"])
def test_data_dependent_sizes_train_like_eager_and_aot_eager(pipeline: str, fn: Callable[..., Any]) -> None:
    backend = passkit.backend(pipeline=pipeline, cache="off")
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    aot_eager = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch.manual_seed(0)
    for x in (torch.randn(32), torch.randn(32), torch.full((32,), -1.0)):
        expected, expected_grad = _run_function(fn, x)
        out, grad = _run_function(compiled, x)
        torch.testing.assert_close(out, expected, **CLOSE)
        torch.testing.assert_close(grad, expected_grad, **CLOSE)
        torch.testing.assert_close((out, grad), _run_function(aot_eager, x), **CLOSE)
    assert _programs(backend) == 1


def _bool_index(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[x > 0] = 0
    return y * 2 + x[x < 0].sum()


def _repeat_unique_nonzero(x: torch.Tensor) -> torch.Tensor:
    repeated = torch.repeat_interleave(x, (x > 0).long() + 1, dim=0).sum()
    return repeated + torch.unique(x.detach().round()).sum() + x.nonzero().float().sum() * x.sum()


def _put_through_a_mask(x: torch.Tensor) -> torch.Tensor:
    # Captured without a shape environment: only index_put's backward calls nonzero, in joint.
    return torch.index_put(x.detach(), (x.detach() > 0,), x[:1].exp()) * x


@pytest.mark.parametrize("pipeline", TRAINING)
@pytest.mark.parametrize("fn", [_bool_index, _repeat_unique_nonzero, _put_through_a_mask],
                         ids=["bool-index", "repeat-unique-nonzero", "backward-makes-the-size"])
def test_data_dependent_ops_train_like_eager_under_aot_function(pipeline: str, fn: Callable[..., Any]) -> None:
    compiled = passkit.aot_function(fn, pipeline=pipeline)
    torch.manual_seed(0)
    for x in (torch.randn(8), torch.randn(8)):
        expected, expected_grad = _run_function(fn, x)
        out, grad = _run_function(compiled, x)
        torch.testing.assert_close(out, expected, **CLOSE)
        torch.testing.assert_close(grad, expected_grad, **CLOSE)


@pytest.mark.parametrize("partition", ["partition.default", "partition.min_cut", "partition.torch_min_cut"])
def test_every_partitioner_splits_a_program_with_unbacked_sizes(partition: str, tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(PARTITIONERS.format(partition=partition))
    torch.manual_seed(0)
    model = MoE()
    compiled = torch.compile(copy.deepcopy(model), backend=passkit.backend(pipeline=str(path), cache="off"), fullgraph=True)
    for x in _moe_batches()[:2]:
        expected, expected_grads = _run_module(model, x)
        out, grads = _run_module(compiled, x)
        torch.testing.assert_close(out, expected, **CLOSE)
        torch.testing.assert_close(grads, expected_grads, **CLOSE)


@pytest.mark.parametrize("pipeline", ["inference-python", "inference"])
def test_moe_routing_runs_inference_like_eager(pipeline: str) -> None:
    torch.manual_seed(0)
    model = MoE().eval()
    compiled = torch.compile(copy.deepcopy(model), backend=passkit.backend(pipeline=pipeline, cache="off"), fullgraph=True)
    with torch.no_grad():
        for x in _moe_batches():
            torch.testing.assert_close(compiled(x), model(x), **CLOSE)


def test_reinplace_skips_a_graph_with_unbacked_sizes_and_says_why(tmp_path) -> None:
    # torch's reinplace pass re-derives values on fakes without a shape environment.
    path = tmp_path / "p.toml"
    path.write_text(REINPLACE)
    torch.manual_seed(0)
    model = MoE().eval()
    compiled = torch.compile(copy.deepcopy(model), backend=passkit.backend(pipeline=str(path), cache="off"), fullgraph=True)
    before = len(passkit.reports())
    with torch.no_grad():
        x = _moe_batches()[0]
        torch.testing.assert_close(compiled(x), model(x), **CLOSE)
    steps = [record for report in passkit.reports()[before:] for record in report.records if record.id == "reinplace"]
    assert [record.stats["skipped"] for record in steps] == [{"main": "data-dependent sizes"}]


@pytest.mark.parametrize("pipeline", TRAINING)
def test_size_checks_torch_asserts_stay_in_the_program(pipeline: str) -> None:
    # ones(n - 2) needs n >= 2: torch asserts it at run time, where eager fails to allocate.
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * torch.ones((x > 0).sum().item() - 2).sum()

    backend = passkit.backend(pipeline=pipeline, cache="off")
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    x = torch.tensor([1.0, 2.0, 3.0, -1.0], requires_grad=True)
    torch.testing.assert_close(compiled(x), fn(x), **CLOSE)
    with pytest.raises(RuntimeError, match="negative dimension"):
        fn(torch.tensor([1.0, -2.0, -3.0, -1.0]))
    with pytest.raises(RuntimeError, match="u[0-9]+ >= 2"):
        compiled(torch.tensor([1.0, -2.0, -3.0, -1.0], requires_grad=True))
    if pipeline == "training-python":
        forward = backend.programs[-1].graphs["forward"]
        asserts = [n for n in forward.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
        assert asserts, forward.code


@pytest.mark.parametrize("pipeline", TRAINING)
def test_moe_program_is_stored_in_and_loaded_from_the_compile_cache(pipeline: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = MoE()
    x = _moe_batches()[0]
    expected, expected_grads = _run_module(model, x)
    for hit in ("miss", "hit"):
        torch._dynamo.reset()
        before = len(passkit.reports())
        compiled = torch.compile(copy.deepcopy(model), backend=passkit.backend(pipeline=pipeline), fullgraph=True)
        out, grads = _run_module(compiled, x)
        torch.testing.assert_close(out, expected, **CLOSE)
        torch.testing.assert_close(grads, expected_grads, **CLOSE)
        report = passkit.reports()[before]
        assert (report.cache, report.uncached) == (hit, "")


@pytest.mark.parametrize("pipeline", TRAINING)
@pytest.mark.parametrize("op", ["take", "put"])
def test_take_and_put_with_a_0_dim_index_match_eager_under_aot_function(pipeline: str, op: str) -> None:
    # torch's take decomposition reads a 0-dim index as a number; passkit keeps it a tensor.
    torch.manual_seed(0)
    x, index, source = torch.randn(3, 4), torch.tensor(5), torch.tensor(2.5)
    if op == "take":
        fn: Callable[..., Any] = lambda a, i, s: torch.take(a, i) * s  # noqa: E731
    else:
        fn = lambda a, i, s: torch.put(a, i, s) * 2  # noqa: E731
    compiled = passkit.aot_function(fn, pipeline=pipeline)
    leaves = [x.clone().requires_grad_(True), source.clone().requires_grad_(True)]
    twins = [x.clone().requires_grad_(True), source.clone().requires_grad_(True)]
    expected = fn(leaves[0], index, leaves[1])
    expected.sum().backward()
    out = compiled(twins[0], index, twins[1])
    out.sum().backward()
    torch.testing.assert_close(out, expected, **CLOSE)
    torch.testing.assert_close([t.grad for t in twins], [t.grad for t in leaves], **CLOSE)


def test_a_python_decision_on_tensor_data_is_one_line_error_or_eager_fallback() -> None:
    fn = lambda x: x * 2 if x.sum() > 0 else x  # noqa: E731
    x = torch.tensor([1.0, -1.0, 2.0], requires_grad=True)
    with pytest.raises(passkit.PasskitError) as info:
        passkit.aot_function(fn, pipeline="training-python")(x)
    assert str(info.value) == (
        "passkit: the program decides on a value read from tensor data (Eq(u0, 1)); passkit traces "
        'data-dependent sizes, not Python decisions on them (on_error = "eager" runs such programs eagerly)'
    )
    assert str(info.value) == DATA_DEPENDENT_GUARD_ERROR.format(expr="Eq(u0, 1)")
    with pytest.warns(RuntimeWarning, match="Python decisions"):
        out = passkit.aot_function(fn, pipeline="training-python", on_error="eager")(x)
    torch.testing.assert_close(out, torch.tensor([2.0, -2.0, 4.0]))


def test_an_op_torch_traces_no_symbolic_result_for_is_one_line_error() -> None:
    fn = lambda x, y: x * 2 if torch.equal(x, y) else x  # noqa: E731
    x = torch.tensor([1.0, -1.0, 2.0], requires_grad=True)
    with pytest.raises(passkit.PasskitError) as info:
        passkit.aot_function(fn, pipeline="training-python")(x, x.detach().clone())
    assert str(info.value) == (
        "passkit: aten.equal.default gives an output whose shape or value depends on tensor data, and "
        'torch traces no symbolic result for it (on_error = "eager" runs such programs eagerly)'
    )
    assert str(info.value) == DATA_DEPENDENT_ERROR.format(op="aten.equal.default")


@pytest.mark.parametrize("pipeline", ["training-python", pytest.param("training", marks=pytest.mark.slow)])
def test_hugging_face_mixtral_trains_whole_like_eager(pipeline: str) -> None:
    # Its sparse MoE block routes tokens with nonzero; under the config it compiles as one graph.
    transformers = require_module("transformers")
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
    )
    torch.manual_seed(0)
    eager = transformers.MixtralForCausalLM(config).train()
    twin = copy.deepcopy(eager)
    backend = passkit.backend(pipeline=pipeline, cache="off")
    compiled = torch.compile(twin, backend=backend, fullgraph=True)
    ids = torch.randint(0, 100, (2, 8))
    expected, out = eager(ids).logits, compiled(ids).logits
    torch.testing.assert_close(out, expected, **CLOSE)
    expected.square().mean().backward()
    out.square().mean().backward()
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **CLOSE, msg=lambda m, name=name: f"{name}: {m}")
    assert _programs(backend) == 1
