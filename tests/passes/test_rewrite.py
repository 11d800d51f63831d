"""The rewrite pass: pattern sets named in a pipeline file, counts in the report, loud misses."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main
from passkit.patterns import Op, Pattern, PatternSet, Var


def _write(tmp_path, steps: str, base: str = "training-python", name: str = "p") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[pipeline]\nname = "{name}"\nextends = "{base}"\n\n{steps}')
    return str(path)


def with_noops(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    hidden = (x * 1).view(4, 3) @ w
    return (hidden.reshape(4, 2) / 1).tanh().sum(0)


def _rewrite_record(compiled):
    return next(r for r in compiled.passkit_reports[0].records if r.id == "rewrite")


def test_pre_grad_rewrite_counts_applications_and_keeps_numerics(tmp_path) -> None:
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\nafter = "functionalize"\n')
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    compiled = passkit.aot_function(with_noops, pipeline=path)
    out = compiled(x, w)
    torch.testing.assert_close(out, with_noops(x, w))
    record = _rewrite_record(compiled)
    assert record.stats["stage"] == "pre-grad"
    assert record.stats["applied"] == {"noops:div_one": 1, "noops:mul_one": 1, "noops:view": 2}
    assert record.stats["rewrites"] == 4


def test_post_grad_rewrite_runs_on_forward_and_backward(tmp_path) -> None:
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\nafter = "partition.default"\n')
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    compiled = passkit.aot_function(with_noops, pipeline=path)
    out = compiled(x, w)
    out.sum().backward()
    w2 = w.detach().clone().requires_grad_(True)
    with_noops(x, w2).sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    record = _rewrite_record(compiled)
    assert record.stats["stage"] == "post-grad"
    assert record.stats["rewrites"] >= 1


def test_inference_program_reports_inference_stage(tmp_path) -> None:
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\nafter = "functionalize"\n', "inference-python")
    compiled = passkit.aot_function(with_noops, pipeline=path)
    compiled(torch.randn(4, 3), torch.randn(3, 2))
    assert _rewrite_record(compiled).stats["stage"] == "inference"


def test_expect_match_fails_the_step_in_one_line(tmp_path) -> None:
    path = _write(
        tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["attention"]\nexpect_match = true\nafter = "functionalize"\n'
    )
    compiled = passkit.aot_function(with_noops, pipeline=path, repro_dir=str(tmp_path / "repro"))
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(4, 3), torch.randn(3, 2, requires_grad=True))
    assert str(info.value) == (
        f"{path}: steps[0] (rewrite) failed: PatternError: pattern 'attention' matched nothing; "
        "attention:mul_masked_fill and 11 more: nearest node view: node view (aten.view.default) fails Where(rank=4) "
        f"(after: functionalize) (reproducer: {tmp_path / 'repro'}/02-rewrite)"
    )


def test_an_unknown_pattern_set_fails_when_the_file_loads_with_a_suggestion(tmp_path) -> None:
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["atention"]\nafter = "functionalize"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(path)
    assert str(info.value) == f"{path}: steps[0] (rewrite).patterns: unknown pattern set 'atention'; did you mean 'attention'?"


def test_patterns_option_must_name_at_least_one_set(tmp_path) -> None:
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = []\nafter = "functionalize"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(path)
    assert "steps[0] (rewrite).patterns" in str(info.value)
    assert "\n" not in str(info.value)


def test_counts_show_in_run_json(tmp_path) -> None:
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["attention", "noops"]\nafter = "decompose"\n')
    result = CliRunner().invoke(main, ["run", path, "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    steps = [s for report in data["reports"] for s in report["steps"] if s["pass_name"] == "rewrite"]
    assert steps[0]["stats"]["applied"]["attention:div_masked_fill"] == 1
    assert steps[0]["stats"]["stage"] == "pre-grad"


def test_a_plugin_pattern_set_is_used_from_a_pipeline_file(tmp_path, register_passkit_plugin) -> None:
    class Plugin:
        @staticmethod
        @passkit.hookimpl
        def passkit_register_patterns():
            def tanh_to_sigmoid(builder, x):
                doubled = builder.call(torch.ops.aten.mul.Tensor, x, 2.0)
                sig = builder.call(torch.ops.aten.sigmoid.default, doubled)
                scaled = builder.call(torch.ops.aten.mul.Tensor, sig, 2.0)
                return builder.call(torch.ops.aten.sub.Tensor, scaled, 1.0)

            pattern = Pattern("tanh", Op(torch.ops.aten.tanh.default, Var("x")), build=tanh_to_sigmoid)
            return {"acme:tanh": PatternSet("acme:tanh", (pattern,))}

    register_passkit_plugin(Plugin(), name="acme")
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["acme:tanh"]\nafter = "functionalize"\n')
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    compiled = passkit.aot_function(with_noops, pipeline=path)
    torch.testing.assert_close(compiled(x, w), with_noops(x, w))
    assert _rewrite_record(compiled).stats["applied"] == {"acme:tanh:tanh": 1}


def test_only_narrows_the_sets_to_the_patterns_it_names(tmp_path) -> None:
    path = _write(
        tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\nonly = ["noops:view"]\nafter = "functionalize"\n'
    )
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    compiled = passkit.aot_function(with_noops, pipeline=path)
    torch.testing.assert_close(compiled(x, w), with_noops(x, w))
    assert _rewrite_record(compiled).stats["applied"] == {"noops:view": 2}


def test_only_naming_a_pattern_the_sets_lack_fails_in_one_line(tmp_path) -> None:
    path = _write(
        tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\nonly = ["noops:veiw"]\nafter = "functionalize"\n'
    )
    compiled = passkit.aot_function(with_noops, pipeline=path, repro_dir="")
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(4, 3), torch.randn(3, 2, requires_grad=True))
    assert str(info.value) == (
        f"{path}: steps[0] (rewrite) failed: ValueError: only names pattern 'noops:veiw', which the named sets "
        "do not have; did you mean 'noops:view'? (after: functionalize)"
    )


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v


def test_a_second_compile_does_not_trace_the_attention_patterns_again(make_program, monkeypatch) -> None:
    from passkit.patterns import trace
    from passkit.testing import assert_pass_preserves_numerics

    lowered = []
    real_lower = trace._lower
    monkeypatch.setattr(trace, "_lower", lambda *args: lowered.append(args) or real_lower(*args))
    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    for _ in range(2):
        lowered.clear()
        program = make_program(_attention, q, k, v, passes=("functionalize", "decompose"))
        assert assert_pass_preserves_numerics("rewrite", program, patterns=["attention"])
        assert "scaled_dot_product_attention" in program.graphs["main"].code
    assert lowered == []  # the first compile in the process traced them; the second reuses them


def test_patterns_are_traced_for_the_table_a_training_main_keeps() -> None:
    # Same opset names, smaller table: a training main keeps ops with their own autograd formula.
    import dataclasses

    from passkit.passes.decompose import DecomposeOptions, _cached_table, main_table
    from passkit.passes.rewrite import resolve_pattern_set
    from passkit.core.program import TargetOpset

    table, kept = _cached_table(DecomposeOptions().tables, [], [])
    opset = TargetOpset(("core_aten",), (), (), table=table, kept=kept)
    main_opset = dataclasses.replace(opset, table=main_table(dict(table), training=True))
    for pattern in resolve_pattern_set("attention").patterns:
        assert pattern.roots(opset) != pattern.roots(main_opset), pattern.name


class DuplicateNamesPlugin:
    @passkit.hookimpl
    def passkit_register_patterns(self) -> dict:
        neg = Var("x")
        double_neg = Op(torch.ops.aten.neg.default, Op(torch.ops.aten.neg.default, neg))

        def dups() -> PatternSet:
            twice = (Pattern("double_neg", double_neg, lambda x: x), Pattern("double_neg", double_neg, lambda x: x))
            return PatternSet("walk:dups", twice)

        return {"walk:dups": dups}


def test_a_set_with_duplicate_pattern_names_fails_when_the_file_loads(tmp_path, register_passkit_plugin) -> None:
    register_passkit_plugin(DuplicateNamesPlugin(), name="walk")
    path = _write(tmp_path, '[[steps]]\npass = "rewrite"\npatterns = ["walk:dups"]\nafter = "functionalize"\n')
    line = f"{path}: steps[0] (rewrite).patterns: pattern set 'walk:dups' has two patterns named 'double_neg'"
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(path)
    assert str(info.value) == line
    result = CliRunner().invoke(main, ["validate", path])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].endswith(line)
