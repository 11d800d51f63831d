"""Run a function or module eagerly and through passkit, and compare everything a user can observe.

``compiled_with`` is the one way tests pick an entry point: ``passkit.compile``, plain
``torch.compile`` with a passkit backend, or the ``make_fx`` path (``aot_function`` /
``aot_module``). ``assert_compiled`` fails when passkit compiled nothing, so a silent eager
fallback never passes for a compiled run.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

import passkit

ENTRIES = ("compile", "torch.compile", "aot")
PIPELINE = "training-python"


def compiled_with(entry: str, target: Any, pipeline: str = PIPELINE, **settings: Any) -> Any:
    """``target`` (a function or module) compiled through ``entry``; it has ``passkit_reports``."""
    torch._dynamo.reset()
    if entry == "compile":
        return passkit.compile(target, pipeline=pipeline, **settings)
    if entry == "torch.compile":
        backend = passkit.backend(pipeline, **settings)
        compiled = torch.compile(target, backend=backend)
        compiled.passkit_reports = backend.reports
        return compiled
    if isinstance(target, torch.nn.Module):
        return passkit.aot_module(target, pipeline=pipeline, **settings)
    return passkit.aot_function(target, pipeline=pipeline, **settings)


def assert_compiled(compiled: Any) -> None:
    """passkit compiled at least one graph, and every compile ran a codegen step."""
    reports = compiled.passkit_reports
    assert reports, "passkit compiled nothing: the program ran eagerly"
    for report in reports:
        ran = [r.pass_name for r in report.records if r.status == "ran"]
        assert any(name.startswith("codegen.") for name in ran), f"no codegen step ran: {ran}"


def _loss(out: Any) -> torch.Tensor:
    total = torch.zeros(())
    for i, leaf in enumerate(pytree.tree_leaves(out)):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            weight = torch.linspace(0.5, 1.5, leaf.numel()).reshape(leaf.shape)
            total = total + (leaf * weight).sum() * (i + 1)
    return total


def assert_same(expected: Any, actual: Any, what: str) -> None:
    exp_leaves, act_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    assert len(exp_leaves) == len(act_leaves), f"{what}: {len(exp_leaves)} vs {len(act_leaves)} values"
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor), f"{what}[{i}] is not a tensor"
            assert e.shape == a.shape and e.stride() == a.stride(), f"{what}[{i}] geometry {e.shape}/{e.stride()} vs {a.shape}/{a.stride()}"
            assert e.requires_grad == a.requires_grad, f"{what}[{i}] requires_grad {e.requires_grad} vs {a.requires_grad}"
            torch.testing.assert_close(a.detach(), e.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}[{i}]: {m}")
        else:
            assert e == a, f"{what}[{i}]: {e!r} vs {a!r}"


def _seeded(make_inputs: Callable[[], Sequence[Any]]) -> list[Any]:
    torch.manual_seed(0)
    return list(make_inputs())


def run_and_compare(
    fn: Callable[..., Any],
    make_inputs: Callable[[], Sequence[Any]],
    entry: str,
    *,
    steps: int = 1,
    backward: bool = True,
    pipeline: str = PIPELINE,
    compiled_fn: Callable[..., Any] | None = None,
) -> tuple[list[Any], list[Any]]:
    """Call eager and compiled ``steps`` times on twin inputs; compare outputs, grads, inputs."""
    eager_inputs, compiled_inputs = _seeded(make_inputs), _seeded(make_inputs)
    compiled = compiled_fn or compiled_with(entry, fn, pipeline)
    for step in range(steps):
        expected = fn(*eager_inputs)
        actual = compiled(*compiled_inputs)
        assert_same(expected, actual, f"step {step} outputs")
        if backward and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in pytree.tree_leaves(expected)
        ):
            _loss(expected).backward()
            _loss(actual).backward()
        for i, (e, a) in enumerate(zip(eager_inputs, compiled_inputs)):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(a.detach(), e.detach(), msg=lambda m: f"step {step} input {i}: {m}")
                assert e.shape == a.shape and e.stride() == a.stride(), f"input {i} geometry"
                leaf_e = e if e.is_leaf else None
                if leaf_e is not None and e.grad is not None:
                    assert a.grad is not None, f"step {step} input {i}: no grad"
                    torch.testing.assert_close(a.grad, e.grad, msg=lambda m: f"step {step} grad of input {i}: {m}")
                elif leaf_e is not None:
                    assert a.grad is None, f"step {step} input {i}: unexpected grad"
    assert_compiled(compiled)
    return eager_inputs, compiled_inputs
