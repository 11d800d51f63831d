"""Higher-order ops (``cond``, ``while_loop``, ``flex_attention``, ``invoke_subgraph``,
``auto_functionalized``) run through every stage of the shipped pipelines as eager runs them.

Each program is compiled with ``torch.compile`` on the ``*-python`` pipelines and on the default
ones (``codegen.inductor``, marked slow), its outputs and gradients compared with eager, and
with torch's own ``backend="aot_eager"`` on the same inputs. ``while_loop`` trains too: its
backward stacks every iteration to a length known only at run time (an unbacked size), which
goes through ``joint``, the partitioners and both code generators. Pass-level tests check that
the graph walkers treat subgraphs as docs/writing-passes.md says.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest
import torch
from torch._higher_order_ops.while_loop import while_loop
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import passkit
from passkit.testing import assert_pass_preserves_numerics

# -- programs -------------------------------------------------------------------------------


def cond_program(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x @ w

    def big(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (h.sin() @ w.t()).relu()

    def small(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return h.cos() @ w.t() + 1

    return torch.cond(h.sum() > 0, big, small, (h, w)) * x


def cond_random_fill(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A branch that fills a transposed tensor in place: the draws follow its layout in eager."""

    def drop(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.t() * torch.empty_like(x.t()).bernoulli_(0.5)) @ w

    def keep(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.t() @ w

    return torch.cond(x.sum() > -1e9, drop, keep, (x, w))


def while_program(x: torch.Tensor) -> torch.Tensor:
    def more(i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return i < 3

    def step(i: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i + 1, v.sin() * 2 + 1

    i, v = while_loop(more, step, (torch.zeros((), dtype=torch.int64), x))
    return v * i


def while_until(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A trip count that depends on the data, and a weight the body reads (an additional input)."""

    def more(h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return h.abs().sum() < 40

    def step(h: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(h @ w) * 1.5 + h, n + 1

    h, n = while_loop(more, step, (x, torch.zeros((), dtype=torch.int64)))
    return h * n


def _relative_position(score: torch.Tensor, b: Any, h: Any, q: Any, kv: Any) -> torch.Tensor:
    return score + (q - kv) * 0.1


def flex_score_mod(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return flex_attention(q, k, v, score_mod=_relative_position)


def _causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return q >= kv


_BLOCK_MASK: list[Any] = []


def _block_mask() -> Any:
    if not _BLOCK_MASK:
        _BLOCK_MASK.append(create_block_mask(_causal, 1, 1, 16, 16, device="cpu"))
    return _BLOCK_MASK[0]


def flex_block_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return flex_attention(q, k, v, block_mask=_block_mask())


def flex_both(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return flex_attention(q, k, v, score_mod=_relative_position, block_mask=_block_mask())


@torch.compiler.nested_compile_region
def _layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).tanh()


def nested_regions(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _layer(_layer(x, w), w).sum(-1)


@torch.library.custom_op("passkit_test_hops::scaled_add_", mutates_args=("out",))
def _scaled_add_(out: torch.Tensor, x: torch.Tensor) -> None:
    out.add_(x * 2)


@_scaled_add_.register_fake
def _(out: torch.Tensor, x: torch.Tensor) -> None:
    return None


def custom_mutation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A custom op that writes into a fresh tensor: functionalized as ``auto_functionalized``."""
    buffer = torch.zeros_like(x)
    _scaled_add_(buffer, y.detach())
    return x.sin() * buffer


def _mm_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 6), torch.randn(6, 6)]


def _qkv() -> list[torch.Tensor]:
    _block_mask()  # made outside the compiled function, as a model makes it once
    return [torch.randn(1, 2, 16, 8) for _ in range(3)]


PROGRAMS: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]] = {
    "cond": (cond_program, _mm_inputs),
    "cond_random_fill": (cond_random_fill, lambda: [torch.randn(6, 4), torch.randn(6, 5)]),
    "while_loop": (while_program, lambda: [torch.randn(5)]),
    "while_until": (while_until, lambda: [torch.randn(3, 4) * 0.3, torch.randn(4, 4) * 0.5]),
    "flex_score_mod": (flex_score_mod, _qkv),
    "flex_block_mask": (flex_block_mask, _qkv),
    "flex_both": (flex_both, _qkv),
    "invoke_subgraph": (nested_regions, _mm_inputs),
    "auto_functionalized": (custom_mutation, lambda: [torch.randn(5), torch.randn(5)]),
}
# Training wherever eager and aot_eager differentiate them: on the CPU flex_attention has no
# backward ("FlexAttention does not support backward on CPU", torch's own error).
TRAINING = ["cond", "cond_random_fill", "while_loop", "while_until", "invoke_subgraph", "auto_functionalized"]
INFERENCE = [name for name in PROGRAMS if name != "flex_both"]
# Inductor's compiles are slow: the default pipelines run each program once, trained where it
# can be, and the two flex_attention forms as one program.
INDUCTOR_INFERENCE = ["while_loop", "flex_both"]
# torch's own AOT functionalizes the in-place fill into a contiguous one and draws other numbers
# than eager on this CPU (passkit keeps the layout, in the branch too).
AOT_EAGER_DRAWS_OTHERWISE = {"cond_random_fill"}

# -- running them ---------------------------------------------------------------------------


def _loss(out: torch.Tensor) -> torch.Tensor:
    return (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum()


def _run(fn: Callable[..., Any], backend: Any, inputs: Sequence[torch.Tensor], training: bool) -> tuple[Any, ...]:
    """Outputs and the gradients of every input, from a seeded call of ``fn`` through ``backend``."""
    args = [x.detach().clone().requires_grad_(training) for x in inputs]
    if backend is not None:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend=backend, fullgraph=True)
    torch.manual_seed(0)
    out = fn(*args)
    if not training:
        return (out.detach(),)
    grads = torch.autograd.grad(_loss(out), args, allow_unused=True)
    return (out.detach(), *grads)


def _assert_close(actual: Sequence[Any], expected: Sequence[Any], what: str, *, atol: float = 1e-6) -> None:
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        if e is None:
            assert a is None, f"{what}[{i}]: a gradient where eager has none"
            continue
        torch.testing.assert_close(a, e, rtol=1e-5, atol=atol, msg=lambda m: f"{what}[{i}]: {m}")


def check_program(name: str, pipeline: str, training: bool, *, against_aot_eager: bool = True) -> None:
    fn, make_inputs = PROGRAMS[name]
    torch.manual_seed(1)
    inputs = make_inputs()
    backend = passkit.backend(pipeline)
    compiled = _run(fn, backend, inputs, training)
    assert backend.reports, "passkit compiled nothing"
    ran = [r.pass_name for r in backend.reports[0].records if r.status == "ran"]
    assert ran[-1].startswith("codegen."), ran
    assert ("joint" in ran) is training, ran
    expected = _run(fn, None, inputs, training)
    _assert_close(compiled, expected, f"{name} on {pipeline} vs eager")
    if against_aot_eager and name not in AOT_EAGER_DRAWS_OTHERWISE:
        _assert_close(_run(fn, "aot_eager", inputs, training), expected, f"{name} on aot_eager vs eager")


@pytest.mark.parametrize("name", TRAINING)
def test_trains_on_training_python(name: str) -> None:
    check_program(name, "training-python", training=True)


@pytest.mark.parametrize("name", INFERENCE)
def test_infers_on_inference_python(name: str) -> None:
    check_program(name, "inference-python", training=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINING)
def test_trains_on_training(name: str) -> None:
    check_program(name, "training", training=True, against_aot_eager=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", INDUCTOR_INFERENCE)
def test_infers_on_inference(name: str) -> None:
    check_program(name, "inference", training=False, against_aot_eager=False)


@pytest.mark.parametrize("name", ["cond", "invoke_subgraph"])
def test_training_pipeline_without_grad_infers(name: str) -> None:
    """The training pipelines compile a program whose inputs need no grad as inference."""
    check_program(name, "training-python", training=False)


@pytest.mark.parametrize("name", INFERENCE)
def test_aot_function_without_dynamo(name: str) -> None:
    """``passkit.aot_function`` captures the ops with ``make_fx``: the same programs, no Dynamo."""
    fn, make_inputs = PROGRAMS[name]
    torch.manual_seed(1)
    inputs = make_inputs()
    training = name in TRAINING
    compiled = passkit.aot_function(fn, pipeline="training-python")
    _assert_close(_run(compiled, None, inputs, training), _run(fn, None, inputs, training), f"{name} vs eager")
    assert compiled.passkit_reports, "passkit compiled nothing"


def _mask_made_inside(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return flex_attention(q, k, v, block_mask=create_block_mask(_causal, 1, 1, 16, 16, device="cpu"))


@pytest.mark.parametrize("entry", ["aot_function", "torch.compile"])
def test_a_block_mask_made_inside_the_function(entry: str) -> None:
    q, k, v = _qkv()
    torch._dynamo.reset()
    if entry == "aot_function":
        compiled = passkit.aot_function(_mask_made_inside, pipeline="inference-python")
    else:
        compiled = torch.compile(_mask_made_inside, backend=passkit.backend("inference-python"), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), _mask_made_inside(q, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pipeline", ["training-python", pytest.param("training", marks=pytest.mark.slow)])
def test_while_loop_trains_through_passkit_compile(pipeline: str) -> None:
    """``passkit.compile`` on both training pipelines: the forward saves every iteration's
    carries, stacked to the trip count the loop finds at run time; two inputs that stop after
    different numbers of iterations run the same compiled program."""
    torch._dynamo.reset()
    compiled = passkit.compile(while_until, pipeline)
    for scale in (0.3, 2.0):
        torch.manual_seed(2)
        inputs = [torch.randn(3, 4) * scale, torch.randn(4, 4) * 0.5]
        # Gradients reach 90 here; one that cancels to 0.07 keeps the rounding of those terms
        # (training-python's decomposed backward ops round otherwise than ATen's kernels).
        expected = _run(while_until, None, inputs, True)
        _assert_close(_run(compiled, None, inputs, True), expected, f"x{scale} vs eager", atol=1e-4)
    assert len(compiled.passkit_reports) == 1, "recompiled for another trip count"
    ran = [r.pass_name for r in compiled.passkit_reports[0].records if r.status == "ran"]
    assert "joint" in ran and ran[-1] == f"codegen.{'python' if pipeline.endswith('python') else 'inductor'}", ran


def test_while_loop_under_no_grad_compiles_in_a_training_pipeline() -> None:
    x = torch.randn(5, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(while_program, backend=passkit.backend("training-python"), fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), while_program(x))


@pytest.mark.parametrize("name", ["cond", "while_until", "invoke_subgraph", "auto_functionalized"])
def test_every_step_keeps_numerics(name: str) -> None:
    """``verify = "numerics"`` compares every stage, subgraphs and all, with the capture."""
    fn, make_inputs = PROGRAMS[name]
    torch.manual_seed(1)  # while_until's trip count, and its rounding, depend on the inputs
    inputs = make_inputs()
    backend = passkit.backend("training-python", verify="numerics")
    compiled = _run(fn, backend, inputs, True)
    _assert_close(compiled, _run(fn, None, inputs, True), f"{name} vs eager")


# -- the graph walkers ----------------------------------------------------------------------

REINPLACE = """
[pipeline]
name = "inference-python-reinplace"
extends = "inference-python"

[[steps]]
pass = "reinplace"
after = "fx.dce"
"""


@pytest.mark.parametrize("name", ["cond", "while_loop", "flex_score_mod"])
def test_reinplace_steps_over_subgraphs(name: str, tmp_path: Any) -> None:
    path = tmp_path / "reinplace.toml"
    path.write_text(REINPLACE)
    check_program(name, str(path), training=False, against_aot_eager=False)



def _branches(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    def both(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sin() * y + x.sin()

    def other(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.cos() * y

    return torch.cond(x.sum() > 0, both, other, (x, y))


def _branch(program: Any) -> torch.fx.GraphModule:
    return program.graphs["main"].true_graph_0


def test_dce_recurses_into_branches_and_keeps_their_get_attrs(make_program: Any) -> None:
    program = make_program(_branches, torch.randn(4), torch.randn(4))
    branch = _branch(program)
    x = next(n for n in branch.graph.nodes if n.op == "placeholder")
    with branch.graph.inserting_after(x):  # dead code inside a branch (tracing leaves none)
        branch.graph.call_function(torch.ops.aten.exp.default, (x,)).meta["val"] = x.meta["val"]
    branch.recompile()
    assert "exp" in _branch(program).code

    assert assert_pass_preserves_numerics("fx.dce", program) is True
    assert "exp" not in _branch(program).code
    assert [n.target for n in program.graphs["main"].graph.nodes if n.op == "get_attr"] == ["true_graph_0", "false_graph_0"]


def test_cse_recurses_into_branches(make_program: Any) -> None:
    program = make_program(_branches, torch.randn(4), torch.randn(4))
    assert _branch(program).code.count("aten.sin") == 2

    assert assert_pass_preserves_numerics("fx.cse", program) is True
    assert _branch(program).code.count("aten.sin") == 1


def _random_branches(x: torch.Tensor) -> torch.Tensor:
    def drop(x: torch.Tensor) -> torch.Tensor:
        return x * torch.empty_like(x).bernoulli_(0.5)

    def keep(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    first = torch.cond(x.sum() > -1e9, drop, keep, (x,))
    second = torch.cond(x.sum() > -1e9, drop, keep, (x,))
    return first + second


def test_cse_never_merges_a_higher_order_op_that_draws(make_program: Any) -> None:
    program = make_program(_random_branches, torch.randn(8))
    gm = program.graphs["main"]
    first, second = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    # Both calls read the same subgraphs, as Dynamo's graphs do for one function called twice.
    second.args = (second.args[0], first.args[1], first.args[2], *second.args[3:])
    gm.graph.eliminate_dead_code()
    gm.recompile()

    assert_pass_preserves_numerics("fx.cse", program)
    assert gm.code.count("higher_order.cond") == 2


@pytest.mark.parametrize("partitioner", ["partition.default", "partition.min_cut"])
def test_partition_never_saves_a_subgraph(make_program: Any, partitioner: str) -> None:
    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    program = make_program(cond_program, x, w, passes=("functionalize", "joint"))

    assert_pass_preserves_numerics(partitioner, program)
    backward = program.graphs["backward"]
    inputs = [n for n in backward.graph.nodes if n.op == "placeholder"]
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in inputs), [n.name for n in inputs]
    assert any(n.op == "get_attr" for n in backward.graph.nodes)


def test_while_loop_trains_with_dynamic_shapes_on_training_python() -> None:
    """``dynamic=True``: one program for two batch sizes. torch's own AOT stops here unless
    ``capture_scalar_outputs`` is set (the backward reads its iteration index with ``.item()``)."""
    torch._dynamo.reset()
    compiled = passkit.compile(while_until, "training-python", dynamic=True)
    for rows in (3, 5):
        torch.manual_seed(1)
        inputs = [torch.randn(rows, 4) * 0.3, torch.randn(4, 4) * 0.5]
        _assert_close(_run(compiled, None, inputs, True), _run(while_until, None, inputs, True), f"{rows} rows vs eager")
    assert len(compiled.passkit_reports) == 1


@pytest.mark.slow
def test_while_loop_with_dynamic_shapes_on_training_is_inductors_one_line() -> None:
    """Inductor traces the backward's body again under Dynamo's fake mode, which refuses the
    ``.item()``; torch's own ``backend="inductor"`` fails there too (and falls back to eager)."""
    torch._dynamo.reset()
    compiled = passkit.compile(while_until, "training", dynamic=True)
    with pytest.raises(passkit.PassError) as caught:
        _run(compiled, None, [torch.randn(3, 4) * 0.3, torch.randn(4, 4) * 0.5], True)
    message = str(caught.value)
    pipeline = passkit.load_pipeline("training")
    expected = (
        f"{pipeline.where(pipeline.steps[-1])} failed at node while_loop (while_loop): PassError: Inductor cannot compile the "
        "'backward' graph (InductorError: DataDependentOutputException: aten._local_scalar_dense.default); use the "
        "'training-python' pipeline, which runs the graph as ATen calls, without Inductor (after: "
        f"{', '.join(s.id for s in pipeline.steps[:-1])}) (reproducer: not written: Unportable: a tensor has symbolic sizes)"
    )
    assert "\n" not in message
    assert message == expected
