"""Fixtures for instrument tests: a tiny program, test passes and a fresh plugin manager."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from passkit.hookspecs import hookimpl
from passkit.instruments import dumps, timing, verify
from passkit.pass_api import graph_pass
from passkit.pipeline import Pipeline, Settings, Step
from passkit.plugins import make_plugin_manager
from passkit.program import Program
from passkit.registry import Registry, build_registry
from passkit import runner

from tiny_programs import make_program

aten = torch.ops.aten


@graph_pass("test.noop")
def noop(program: Program) -> bool:
    """Do nothing."""
    return False


@graph_pass("test.add_dead")
def add_dead(program: Program) -> bool:
    """Append a node nobody reads."""
    gm = program.graphs["main"]
    x = next(iter(gm.graph.nodes))
    with gm.graph.inserting_after(x):
        gm.graph.call_function(aten.neg.default, (x,))
    gm.recompile()
    return True


@graph_pass("test.mutate")
def mutate(program: Program) -> bool:
    """Turn every out-of-place add into an in-place one."""
    gm = program.graphs["main"]
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            node.target = aten.add_.Tensor
    gm.recompile()
    return True


@graph_pass("test.fake_functional", produces={"functional"})
def fake_functional(program: Program) -> bool:
    """Claim functional without removing mutations."""
    return False


@graph_pass("test.boom")
def boom(program: Program) -> bool:
    """Fail."""
    raise RuntimeError("kaboom")


class PassesForTests:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [noop, add_dead, mutate, fake_functional, boom]


class Kit:
    """A plugin manager with the runner, the instruments and the test passes."""

    def __init__(self) -> None:
        self.pm = make_plugin_manager(load_entry_points=False, builtins=False)
        for name, module in (("runner", runner), ("timing", timing), ("dumps", dumps), ("verify", verify)):
            self.pm.register(module, name=name)
        self.pm.register(PassesForTests(), name="test")
        self.registry: Registry = build_registry(self.pm)

    def pipeline(self, *pass_names: str, **settings: Any) -> Pipeline:
        steps = tuple(
            Step(position=i, id=name, pass_name=name, options=self.registry.get_pass(name).options(),
                 when=None, enabled=True, origin={})
            for i, name in enumerate(pass_names)
        )
        return Pipeline(name="t", description="", source=Path("t.toml"), settings=Settings(**settings),
                        settings_origin={}, steps=steps, files=(Path("t.toml"),))

    def run(self, pipeline: Pipeline, program: Program, **kwargs: Any):
        return runner.run_pipeline(pipeline, program, pm=self.pm, registry=self.registry, **kwargs)


@pytest.fixture
def kit() -> Kit:
    return Kit()


@pytest.fixture
def program_factory() -> Callable[..., Program]:
    return make_program
