"""Compiled optimizer steps: ``torch.compile(opt.step, backend=...)`` updates the parameters and
every state tensor as eager's step does, in place, over several steps.

Dynamo hands the step its parameters and state as graph attributes (only the gradients are
inputs); passkit lifts them into inputs, and the program's writes to them land in the caller's
own tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import passkit

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd_momentum": lambda params, foreach: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=foreach),
    "adam": lambda params, foreach: torch.optim.Adam(params, lr=0.01, foreach=foreach),
    "adamw": lambda params, foreach: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=foreach),
}
STEPS = 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(6, 8, generator=torch.Generator().manual_seed(step))


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and every state tensor, named (``exp_avg``, ``momentum_buffer``, ``step``)."""
    named = []
    for i, p in enumerate(model.parameters()):
        named.append((f"param[{i}]", p))
        for key, value in sorted(opt.state[p].items()):
            if isinstance(value, torch.Tensor):
                named.append((f"param[{i}].{key}", value))
    return named


def _train(kind: str, foreach: bool, compile_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None,
           steps: int = STEPS) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[list[tuple[str, int]]]]:
    """``steps`` backward + step rounds; the data pointers of every tensor after each step."""
    model = _model()
    opt = OPTIMIZERS[kind](model.parameters(), foreach)
    step = compile_step(opt.step) if compile_step is not None else opt.step
    pointers = []
    for i in range(steps):
        opt.zero_grad()
        model(_batch(i)).square().mean().backward()
        step()
        pointers.append([(name, t.data_ptr()) for name, t in _state(model, opt)])
    return model, opt, pointers


def _assert_same_state(expected: tuple[torch.nn.Module, torch.optim.Optimizer],
                       actual: tuple[torch.nn.Module, torch.optim.Optimizer]) -> None:
    want, got = _state(*expected), _state(*actual)
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, e), (_, a) in zip(want, got):
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"{name}: {m}")


def _dynamo(backend: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda step: torch.compile(step, backend=backend)


def _mutating_programs(compiler: passkit.frontends.api.PasskitBackend) -> int:
    """How many inference programs the backend compiled that write to their inputs."""
    return sum(
        not program.training and any(info.mutates_data for info in program.signature.inputs)
        for program in compiler.programs
    )


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single_tensor"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_compiled_step_matches_eager_python_codegen(kind: str, foreach: bool) -> None:
    eager = _train(kind, foreach, None)
    compiler = passkit.backend("training-python")
    _assert_same_state(eager[:2], _train(kind, foreach, _dynamo(compiler))[:2])
    assert _mutating_programs(compiler) >= 1  # the steps ran compiled, not as Dynamo's fallback
    # The same case through torch's own AOT Autograd agrees with eager too.
    torch._dynamo.reset()
    _assert_same_state(eager[:2], _train(kind, foreach, _dynamo("aot_eager"))[:2])


@pytest.mark.slow
@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single_tensor"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_compiled_step_matches_eager_inductor_codegen(kind: str, foreach: bool) -> None:
    eager = _train(kind, foreach, None)
    before = len(passkit.reports())
    _assert_same_state(eager[:2], _train(kind, foreach, _dynamo("passkit"))[:2])
    reports = passkit.reports()[before:]
    assert reports and all(r.pipeline == "training" for r in reports)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "single_tensor"])
def test_a_step_given_its_tensors_as_inputs(foreach: bool) -> None:
    """Parameters and state passed in as arguments (placeholders, not graph attributes) are
    written back in place as well: a momentum step written by hand."""

    def step(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor]) -> None:
        with torch.no_grad():
            if foreach:
                torch._foreach_mul_(bufs, 0.9)
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(params, bufs, alpha=-0.1)
            else:
                for p, g, b in zip(params, grads, bufs):
                    b.mul_(0.9).add_(g)
                    p.add_(b, alpha=-0.1)

    def run(fn: Callable[..., Any]) -> list[torch.Tensor]:
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]
        bufs = [torch.zeros_like(p) for p in params]
        pointers = [t.data_ptr() for t in [*params, *bufs]]
        for i in range(STEPS):
            fn(params, [torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) for p in params], bufs)
        assert [t.data_ptr() for t in [*params, *bufs]] == pointers
        assert all(p.is_leaf and p.grad_fn is None for p in params)
        return [*params, *bufs]

    compiler = passkit.backend("training-python")
    for got, want in zip(run(torch.compile(step, backend=compiler)), run(step)):
        torch.testing.assert_close(got, want)
    assert _mutating_programs(compiler) >= 1
    kinds = {info.name: info.kind for info in compiler.programs[-1].signature.inputs}
    assert [kind for name, kind in kinds.items() if "params" in name] == ["param", "param"]


def _training_loop(compile_model: Callable[..., Any] | None, compile_step: Callable[..., Any] | None
                   ) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[torch.Tensor]]:
    model = _model()
    opt = OPTIMIZERS["adamw"](model.parameters(), True)
    forward = compile_model(model) if compile_model is not None else model
    step = compile_step(opt.step) if compile_step is not None else opt.step
    losses = []
    for i in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = forward(_batch(i)).square().mean()
        loss.backward()
        step()
        losses.append(loss.detach())
    return model, opt, losses


@pytest.mark.parametrize("pipeline", ["training-python", pytest.param("training", marks=pytest.mark.slow)])
def test_training_loop_with_compiled_model_and_compiled_step(pipeline: str) -> None:
    eager = _training_loop(None, None)
    compiler = passkit.backend(pipeline)
    compiled = _training_loop(_dynamo(compiler), _dynamo(compiler))
    torch.testing.assert_close(compiled[2], eager[2])
    _assert_same_state(eager[:2], compiled[:2])
    assert any(program.training for program in compiler.programs) and _mutating_programs(compiler) >= 1


@pytest.mark.parametrize("pipeline", ["training-python", pytest.param("training", marks=pytest.mark.slow)])
def test_parameters_and_state_are_updated_in_place(pipeline: str) -> None:
    model = _model()
    opt = OPTIMIZERS["adamw"](model.parameters(), True)
    model(_batch(0)).sum().backward()
    opt.step()  # eager's first step creates the state; the compiled steps must keep its tensors
    before = [(name, t, t.data_ptr()) for name, t in _state(model, opt)]
    step = passkit.compile(opt.step, pipeline=pipeline)
    for i in range(2):
        opt.zero_grad()
        model(_batch(i)).sum().backward()
        step()
    after = _state(model, opt)
    assert [name for name, _ in after] == [name for name, _, _ in before]
    for (name, tensor, pointer), (_, now) in zip(before, after):
        assert now is tensor, name
        assert now.data_ptr() == pointer, name
    assert all(p.is_leaf and p.requires_grad and p.grad_fn is None for p in model.parameters())
    assert int(opt.state[next(model.parameters())]["step"]) == 3


def test_state_created_by_the_compiled_step_stays_where_it_was_made() -> None:
    *_, pointers = _train("adam", True, _dynamo(passkit.backend("training-python")))
    assert pointers[1:] == pointers[:-1]


@pytest.mark.slow
def test_inductor_writes_every_update_in_its_kernels() -> None:
    """As torch's ``keep_inference_input_mutations``: the compiled step writes each parameter and
    state tensor in the kernel that computes it, so it allocates nothing and the runtime copies
    nothing back."""
    compiler = passkit.backend("training")
    model, opt, _ = _train("adamw", True, _dynamo(compiler), steps=1)
    program = compiler.programs[-1]
    mutated = sum(info.mutates_data for info in program.signature.inputs)
    assert mutated == len(_state(model, opt))
    assert compiler.reports[-1].records[-1].stats["mutations_written_in_graph"] == mutated
    source = program.compiled["main"].passkit_source
    assert "empty_strided" not in source.split("def call(", 1)[1]


def test_python_codegen_copies_each_update_back_once() -> None:
    """The Python program returns each new value and the runtime copies it into the caller's
    tensor: one ``copy_`` per mutated tensor, as ``aot_eager`` does, and no ``clone``."""
    compiler = passkit.backend("training-python")
    _train("sgd_momentum", True, _dynamo(compiler))
    # The first step makes the momentum buffers (eager clones the gradients there too); the
    # steps after it run the second program, which updates them.
    assert len(compiler.programs) == 2
    program = compiler.programs[-1]
    targets = [str(n.target) for n in program.graphs["main"].graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "clone" in t or "copy" in t]
    assert sum(d.kind == "mutation" for d in program.io("main").outputs) == 8  # 4 parameters, 4 buffers
