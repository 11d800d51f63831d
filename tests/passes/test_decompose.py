"""decompose: tables, keep, extra, before or after joint, and the decomposed fact."""

from __future__ import annotations

import pytest
import torch

import passkit
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass


def _ops(program) -> set[str]:
    return {str(n.target) for gm in program.graphs.values() for n in gm.graph.nodes if n.op == "call_function"}


def _pipeline(tmp_path, decompose: str, *, order: str = "after", verify: str = "numerics", extra: str = "") -> str:
    steps = ['[[steps]]\npass = "functionalize"\n', '[[steps]]\npass = "joint"\n', decompose]
    if order == "before":
        steps[1], steps[2] = steps[2], steps[1]
    steps += ['[[steps]]\npass = "partition.default"\n', extra, '[[steps]]\npass = "codegen.python"\n']
    path = tmp_path / "p.toml"
    path.write_text(
        f'[pipeline]\nname = "p"\n\n[settings]\nverify = "{verify}"\nrepro_dir = "{tmp_path / "repro"}"\n\n'
        + "\n".join(s for s in steps if s)
    )
    return str(path)


def _run(pipeline: str):
    compiled = passkit.aot_function(lambda x, w: torch.nn.functional.gelu(x @ w).softmax(-1), pipeline=pipeline)
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    out = compiled(x, w)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x @ w).softmax(-1))
    out.sum().backward()
    return compiled


@pytest.mark.parametrize("order", ["before", "after"])
def test_core_aten_before_or_after_joint_keeps_numerics_and_facts(tmp_path, order: str) -> None:
    compiled = _run(_pipeline(tmp_path, '[[steps]]\npass = "decompose"\n', order=order))
    (report,) = compiled.passkit_reports
    assert all(r.status == "ran" for r in report.records)


def test_keep_leaves_ops_whole_in_forward_and_backward(tmp_path) -> None:
    decompose = '[[steps]]\npass = "decompose"\nkeep = ["aten.gelu", "aten.gelu_backward.default", "aten._softmax.default"]\n'
    from passkit.frontends.capture import program_from_function

    program = program_from_function(lambda x, w: torch.nn.functional.gelu(x @ w).softmax(-1),
                                    [torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)])
    pipeline = passkit.load_pipeline(_pipeline(tmp_path, decompose, verify="facts"))
    from passkit.core.runner import run_pipeline

    run_pipeline(pipeline, program, pm=get_plugin_manager(), registry=get_registry())
    ops = _ops(program)
    assert {"aten.gelu.default", "aten.gelu_backward.default", "aten._softmax.default"} <= ops
    assert "aten.t.default" not in ops  # Core ATen lowers t to permute


def test_extra_adds_ops_from_the_full_table(tmp_path) -> None:
    from passkit.frontends.capture import program_from_function
    from passkit.core.runner import run_pipeline

    program = program_from_function(lambda x: torch.nn.functional.gelu(x).t(), [torch.randn(3, 4)])
    path = tmp_path / "inf.toml"
    path.write_text('[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "decompose"\ntables = []\n'
                    'extra = ["aten.gelu.default"]\n\n[[steps]]\npass = "codegen.python"\n\n[settings]\nverify = "facts"\n')
    run_pipeline(passkit.load_pipeline(str(path)), program, pm=get_plugin_manager(), registry=get_registry())
    ops = _ops(program)
    assert "aten.gelu.default" not in ops and "aten.t.default" in ops


def test_unknown_op_in_keep_is_a_load_error(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "decompose"\nkeep = ["aten.gelux.default"]\n\n'
                    '[[steps]]\npass = "codegen.python"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(str(path))
    assert str(info.value) == f"{path}: steps[1] (decompose).keep: unknown op 'aten.gelux.default'"


@graph_pass("test.bring_back_t", requires={"decomposed"})
def bring_back_t(program) -> bool:
    """Re-introduce an op the Core ATen table decomposes (aten.t)."""
    for gm in program.graphs.values():
        matrix = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.meta["val"].dim() == 2)
        with gm.graph.inserting_after(matrix):
            gm.graph.call_function(torch.ops.aten.t.default, (matrix,))
        gm.recompile()
    return True


class _Plugin:
    @hookimpl
    def passkit_register_passes(self):
        return [bring_back_t]

    @hookimpl
    def passkit_register_decompositions(self):
        def gelu_as_tanh_table():
            return {torch.ops.aten.gelu.default: lambda x, approximate="none": torch.tanh(x)}

        return {"test_gelu_tanh": gelu_as_tanh_table}


@pytest.fixture
def plugin(register_passkit_plugin):
    register_passkit_plugin(_Plugin(), name="test-decompose-plugin")


def test_fact_verification_names_ops_outside_the_opset(tmp_path, plugin) -> None:
    pipeline = _pipeline(tmp_path, '[[steps]]\npass = "decompose"\n', verify="facts",
                         extra='[[steps]]\npass = "test.bring_back_t"\n')
    with pytest.raises(passkit.VerificationError) as info:
        _run(pipeline)
    assert str(info.value) == (
        f"{pipeline}: steps[4] (test.bring_back_t) broke fact 'decomposed': ops outside the target opset: aten.t.default "
        f"(reproducer: {tmp_path / 'repro'}/05-test.bring_back_t)"
    )


def test_plugins_register_decomposition_tables(tmp_path, plugin) -> None:
    from passkit.frontends.capture import program_from_function
    from passkit.core.runner import run_pipeline

    program = program_from_function(lambda x: torch.nn.functional.gelu(x), [torch.randn(3)])
    path = tmp_path / "p.toml"
    path.write_text('[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "decompose"\ntables = ["test_gelu_tanh"]\n\n'
                    '[[steps]]\npass = "codegen.python"\n')
    run_pipeline(passkit.load_pipeline(str(path)), program, pm=get_plugin_manager(), registry=get_registry())
    assert "aten.tanh.default" in _ops(program) and "aten.gelu.default" not in _ops(program)


def test_detach_still_stops_gradients_when_decomposing_before_joint(tmp_path) -> None:
    pipeline = _pipeline(tmp_path, '[[steps]]\npass = "decompose"\n', order="before", verify="facts")
    compiled = passkit.aot_function(lambda x: x * x.detach(), pipeline=pipeline)
    x = torch.randn(4, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, x.detach())  # d/dx (x * const) = const, not 2x


def test_core_aten_target_is_ops_tagged_core(tmp_path) -> None:
    def fn(x):
        var, mean = torch.var_mean(x, dim=0)
        return var + mean

    def pipeline(extra: str) -> str:
        path = tmp_path / "p.toml"
        path.write_text(f'[settings]\nverify = "facts"\nrepro_dir = "{tmp_path / "repro"}"\n\n'
                        f'[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "decompose"\n{extra}\n'
                        '[[steps]]\npass = "codegen.python"\n')
        return str(path)

    with pytest.raises(passkit.VerificationError) as info:
        passkit.aot_function(fn, pipeline=pipeline(""))(torch.randn(4, 3))
    assert str(info.value).endswith(
        "steps[1] (decompose) broke fact 'decomposed': ops outside the target opset: aten.var_mean.correction "
        f"(reproducer: {tmp_path / 'repro'}/02-decompose)"
    )
    lowered = passkit.aot_function(fn, pipeline=pipeline('extra = ["aten.var_mean.correction"]'))
    x = torch.randn(4, 3)
    torch.testing.assert_close(lowered(x), fn(x))


@pytest.mark.parametrize("order", ["before", "after"])
def test_dropout_on_a_transposed_activation_meets_the_core_aten_fact(tmp_path, order: str) -> None:
    # Dropout draws into empty_like(x).bernoulli_(p): torch's table lowers empty_like to
    # empty_permuted (not Core ATen, and lowered by no torch table), and the random op stays
    # whole on purpose; neither may break the fact.
    pipeline = _pipeline(tmp_path, '[[steps]]\npass = "decompose"\n', order=order, verify="facts")

    def fn(x, w):
        return torch.nn.functional.dropout((x @ w).t(), p=0.5, training=True) * 2

    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    compiled = passkit.aot_function(fn, pipeline=pipeline)
    torch.manual_seed(3)
    out = compiled(x, w)
    torch.manual_seed(3)
    torch.testing.assert_close(out, fn(x, w), rtol=0, atol=0)


def test_a_training_main_with_nothing_to_lower_is_kept_as_it_is(make_program) -> None:
    from passkit.testing import assert_pass_preserves_numerics

    # Before joint, a training main keeps every op with its own autograd formula (mm, layer norm),
    # so Inductor's table lowers nothing here: no re-trace, which would only add unused getitems.
    def fn(x, w):
        return torch.nn.functional.layer_norm(x @ w, (5,))

    program = make_program(fn, torch.randn(3, 4), torch.randn(4, 5, requires_grad=True))
    before = program.graphs["main"]
    changed = assert_pass_preserves_numerics("decompose", program, tables=["inductor"])
    assert not changed
    assert program.graphs["main"] is before
    assert "getitem_1" not in program.graphs["main"].code
    assert "decomposed" in program.facts


def test_a_main_with_an_op_to_lower_is_still_lowered(make_program) -> None:
    from passkit.testing import assert_pass_preserves_numerics

    def fn(x, w):
        return torch.nn.functional.hardswish(x * w)  # Inductor's table decomposes hardswish

    program = make_program(fn, torch.randn(3, 4), torch.randn(3, 4))
    assert not program.training
    assert "hardswish" in program.graphs["main"].code
    assert assert_pass_preserves_numerics("decompose", program, tables=["inductor"])
    assert "hardswish" not in program.graphs["main"].code


def test_nothing_to_decompose_sees_ops_that_tracing_breaks_up_by_itself() -> None:
    from passkit import _torch

    args = [torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)]
    pre = _torch.trace_graph(torch.nn.functional.linear, args, pre_dispatch=True)
    post = _torch.trace_graph(torch.nn.functional.linear, args, pre_dispatch=False)
    assert "aten.linear.default" in pre.code  # CompositeImplicitAutograd: a post-dispatch trace lowers it
    assert not _torch.nothing_to_decompose(pre, {})
    assert _torch.nothing_to_decompose(post, {})
    assert not _torch.nothing_to_decompose(post, {torch.ops.aten.addmm.default: None})
