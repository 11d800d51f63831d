"""A program written to a folder reads back, in a form that computes the same, without the model."""

from __future__ import annotations

from pathlib import Path

import dataclasses

import torch
from torch import fx

import passkit
from passkit.frontends.capture import program_from_function
from passkit.artifacts.program_file import read_program, write_program
from passkit.artifacts.snapshot import snapshot_program
from passkit.verify.evaluate import Reference
from passkit.core.plugins import get_plugin_manager
from passkit.core.program import GraphIO, Program, Signature
from passkit.core.registry import get_registry
from passkit.core.runner import run_pipeline

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")


def _program_after(steps: int) -> tuple[Program, list[torch.Tensor]]:
    inputs = [torch.randn(3, 4), torch.randn(4, 4, requires_grad=True)]
    program = program_from_function(lambda x, w: ((x @ w).relu() + x,), inputs)
    pipeline = passkit.load_pipeline(FIXED_TRAINING)
    run_pipeline(dataclasses.replace(pipeline, steps=pipeline.steps[:steps]), program, pm=get_plugin_manager(), registry=get_registry())
    return program, inputs


def test_a_partitioned_program_round_trips(tmp_path) -> None:
    program, inputs = _program_after(4)  # functionalize, decompose, joint, partition.default
    reference = Reference(program, inputs)
    assert write_program(program, tmp_path) is None
    back = read_program(tmp_path, get_registry())
    assert {name: gm.code for name, gm in back.graphs.items()} == {name: gm.code for name, gm in program.graphs.items()}
    assert (back.facts, back.training, back.signature) == (program.facts, program.training, program.signature)
    assert back.target_opset == program.target_opset and back.target_opset.table  # rebuilt from the names
    for ours, theirs in zip(program.graphs["backward"].graph.nodes, back.graphs["backward"].graph.nodes):
        old, new = ours.meta.get("val"), theirs.meta.get("val")
        if isinstance(old, torch.Tensor):
            assert (new.shape, new.dtype, new.stride()) == (old.shape, old.dtype, old.stride())
    assert reference.compare(back) is None
    assert sorted(p.name for p in (tmp_path / "graphs").iterdir()) == ["backward.py", "forward.py"]


def test_a_snapshot_is_unaffected_by_later_steps() -> None:
    program, _ = _program_after(3)
    copy = snapshot_program(program)
    code = copy.graphs["joint"].code
    for node in program.graphs["joint"].graph.nodes:
        if node.op == "call_function":
            node.target = torch.ops.aten.neg.default if len(node.args) == 1 else node.target
    program.graphs["joint"].recompile()
    assert copy.graphs["joint"].code == code != program.graphs["joint"].code


def user_helper(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_graph_that_calls_user_code_is_written_as_code_but_not_replayable(tmp_path) -> None:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(user_helper, (x,)),))
    program = Program(
        graphs={"main": fx.GraphModule(torch.nn.Module(), graph)},
        signature=Signature(inputs=[], outputs=[], graph_io={"main": GraphIO([], [])}),
        example_inputs=[], facts={"captured"},
    )
    reason = write_program(program, tmp_path)
    assert reason == (
        f"the program refers to {__name__}.user_helper, which cannot be loaded without the user's code"
    )
    assert "user_helper(x)" in (tmp_path / "graphs" / "main.py").read_text()
    assert not (tmp_path / "program.pkl").exists()
