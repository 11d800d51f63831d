"""Fixtures for instrument tests: a tiny program, test passes and a fresh plugin manager."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

from tiny_programs import Kit, make_program

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


@graph_pass("test.approximate", tolerance=(1e-2, 1e-6))
def approximate(program: Program) -> bool:
    """An approximation by design that declares how far it may drift."""
    return False


@graph_pass("test.boom")
def boom(program: Program) -> bool:
    """Fail."""
    raise RuntimeError("kaboom")


class PassesForTests:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [noop, add_dead, mutate, fake_functional, approximate, boom]


@pytest.fixture
def kit() -> Kit:
    return Kit(PassesForTests())


@pytest.fixture
def program_factory() -> Callable[..., Program]:
    return make_program
