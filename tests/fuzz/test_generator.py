"""The generator: a seed replays the same programs; programs are valid and print as code."""

from __future__ import annotations

import torch

from passkit.fuzz.generator import each_program, programs
from passkit.fuzz.ops import OPS
from passkit.fuzz.program import FuzzProgram, Input, Node


def _drawn(seed: int, count: int, modes=("training", "inference")) -> list[FuzzProgram]:
    seen: list[FuzzProgram] = []
    each_program(programs(modes), lambda p: seen.append(p) or True, seed=seed, count=count)
    return seen


def test_a_seed_draws_the_same_programs_every_time_and_another_seed_others() -> None:
    first = _drawn(7, 40)
    assert [p.source() for p in first] == [p.source() for p in _drawn(7, 40)]
    assert [p.source() for p in first] != [p.source() for p in _drawn(8, 40)]
    assert len(first) == 40


def test_the_vocabulary_is_what_broke_passkit_before_and_most_programs_run_eagerly() -> None:
    drawn = _drawn(1, 120)
    used = {op for p in drawn for op in p.used_ops()}
    # views of inputs and intermediates, writes, random ops, custom Functions, BatchNorm and a
    # buffer, data-dependent ops: each part of the vocabulary is drawn
    groups = {
        "views": {"expand", "t", "tail", "row", "detach"}, "writes": {"add_", "copy_", "add_from", "zero_"},
        "random ops": {"dropout", "rand_mul", "bernoulli"}, "custom Functions": {"half", "double_mut", "view_fn"},
        "BatchNorm and buffers": {"batchnorm", "buf_update", "buf_read"}, "data-dependent": {"nonzero", "item", "masked_select"},
    }
    for group, ops in groups.items():
        assert len(ops & used) >= 2, (group, ops & used)
    assert any(p.dynamic for p in drawn) and any(not p.dynamic for p in drawn)
    assert {p.mode for p in drawn} == {"training", "inference"}
    valid = 0
    for program in drawn:
        model, inputs = program.build()
        try:
            model(*inputs)
            valid += 1
        except Exception:  # noqa: BLE001 - eager refuses a few (a write into a value the backward saved)
            pass
    assert valid >= 0.9 * len(drawn)
    stray = sorted(set(OPS) - used)
    assert len(stray) <= 6, f"ops never drawn in 120 programs: {stray}"


def test_a_program_prints_as_a_module_whose_factory_returns_the_model_and_its_inputs() -> None:
    program = FuzzProgram(
        inputs=(Input((1, 4), requires_grad=True),), nodes=(Node("abs", (0,)), Node("expand", (1,))), outputs=(2,),
    )
    assert "        v1 = x0.abs()\n        v2 = v1.expand(3, -1)\n        return (v2,)" in program.source()
    model, (x,) = program.build()
    assert x.requires_grad and x.shape == (1, 4)
    (out,) = model(x)
    torch.testing.assert_close(out, x.abs().expand(3, -1))


def test_dropping_a_node_rewires_its_readers_to_its_operand_and_drops_what_no_longer_fits() -> None:
    program = FuzzProgram(
        inputs=(Input((3, 4)), Input((1, 4))),
        nodes=(Node("abs", (0,)), Node("sum_rows", (2,)), Node("neg", (3,)), Node("add", (2, 1))),
        outputs=(4, 5),
    )
    # abs dropped: its readers read x0; the unused input goes
    assert program.without({0}).source().count("x0.abs()") == 0
    smaller = program.without({1})  # sum_rows dropped: neg cannot read x0.abs() (other shape) and goes too
    assert [n.op for n in smaller.nodes] == ["abs", "add"]
    assert smaller.outputs == (3,)
    assert program.without({0, 1, 2, 3}) is not None  # outputs fall back to inputs

