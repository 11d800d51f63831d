"""Shared by runner and instrument tests: a hand-built program ``main(x, y) = (x + y) * y`` and
``Kit``, a plugin manager with test passes that runs pipelines built in Python; and the checks
that a compiled model trains like eager; the pipeline file that adds the ``regions`` step."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import torch
from torch import fx

import passkit



def regions_overlay(base: str, name: str | None = None) -> str:
    """A pipeline file: ``base`` with the ``regions`` step on (docs/regions.md), named ``name``
    (``<base>-regions`` unless given), outlining layers that repeat twice or more; added before
    ``functionalize`` where ``base`` has none."""
    name = name or f"{base}-regions"
    head = f'[pipeline]\nname = "{name}"\nextends = "{base}"\n\n'
    if any(step.id == "regions" for step in passkit.load_pipeline(base).steps):
        return head + "[override.regions]\nenabled = true\nmin_repeats = 2\n"  # the tests' stacks are shallow
    return head + '[[steps]]\npass = "regions"\nbefore = "functionalize"\n'


# ``training-python`` with the ``regions`` step, as a file named regions-python.
REGIONS_PYTHON = regions_overlay("training-python", "regions-python")

from passkit.pipeline import Pipeline, Settings, Step
from passkit.core.program import GraphIO, Program, Signature
from passkit.core.report import Report
from passkit.core.runner import run_pipeline

aten = torch.ops.aten


def make_program(*, mutating: bool = False, dead: bool = False, training: bool = False) -> Program:
    """The add is in place when ``mutating``; ``dead`` adds a node nobody reads."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    if dead:
        graph.call_function(aten.neg.default, (x,))
    total = graph.call_function(aten.add_.Tensor if mutating else aten.add.Tensor, (x, y))
    graph.output(graph.call_function(aten.mul.Tensor, (total, y)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    signature = Signature(inputs=[], outputs=[], graph_io={"main": GraphIO([], [])})
    return Program(graphs={"main": gm}, signature=signature, example_inputs=[], facts={"captured"}, training=training)


class Kit:
    """A plugin manager with the essential built-ins, the instruments and the given test plugins,
    its registry, and pipelines built in Python from pass names."""

    def __init__(self, *plugins: Any) -> None:
        from passkit.instruments import dumps, timing, verify
        from passkit.core.plugins import make_plugin_manager
        from passkit.core.registry import build_registry

        self.pm = make_plugin_manager(load_entry_points=False, builtins=False)
        for name, module in (("timing", timing), ("dumps", dumps), ("verify", verify)):
            self.pm.register(module, name=name)
        for index, plugin in enumerate(plugins):
            self.pm.register(plugin, name=f"test{index}")
        self.registry = build_registry(self.pm)

    def pipeline(self, *specs: str | dict[str, Any], **settings: Any) -> Pipeline:
        """Steps from pass names, or dicts with ``pass`` and optional ``id``, ``options``,
        ``when``, ``enabled`` and ``location``."""
        steps = []
        for position, spec in enumerate(specs):
            spec = {"pass": spec} if isinstance(spec, str) else dict(spec)
            pass_ = self.registry.get_pass(spec.pop("pass"))
            steps.append(Step(
                position=position, id=spec.pop("id", pass_.name), pass_=pass_,
                options=pass_.options(registry=self.registry, **spec.pop("options", {})),
                when=spec.pop("when", None), enabled=spec.pop("enabled", True), origin={},
                **spec,
            ))
        return Pipeline(name="t", description="", source=Path("t.toml"), settings=Settings(**settings),
                        settings_origin={}, steps=tuple(steps), files=(Path("t.toml"),))

    def run(self, pipeline: Pipeline, program: Program, **kwargs: Any) -> Report:
        return run_pipeline(pipeline, program, pm=self.pm, registry=self.registry, **kwargs)


def assert_loss_and_grads_match(out: torch.Tensor, expected: torch.Tensor, eager: torch.nn.Module, twin: torch.nn.Module) -> None:
    """Compiled ``out`` equals eager's ``expected``, and after ``square().mean().backward()`` on
    both, ``twin``'s parameter gradients equal ``eager``'s (at matmul-reordering tolerances); a
    parameter eager leaves without a gradient has none in ``twin`` either."""
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    out.square().mean().backward()
    expected.square().mean().backward()
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        if p.grad is None:
            assert q.grad is None, f"{name}: eager gives it no gradient, the compiled model gives it one"
        else:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-6, msg=name)


def assert_seeded_steps_match_eager(make_model: Callable[[], torch.nn.Module], x: torch.Tensor, pipeline: str,
                                    steps: int = 2) -> Any:
    """Seeded alike before each of ``steps`` steps, the compiled model's outputs and its gradients
    equal eager's (so random ops draw what eager draws); returns the compiled model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = make_model()
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline=pipeline, cache="off")
    for step in range(steps):
        torch.manual_seed(step)
        expected = eager(x)
        torch.manual_seed(step)
        actual = compiled(x)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"step {step} output: {m}")
        expected.square().mean().backward()
        actual.square().mean().backward()
    for (name, p_eager), p_twin in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"grad {name}: {m}")
    return compiled
