"""partition.min_cut: budgets, limits, estimators and checkpoint rules change what is saved, as documented."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import passkit
from allocations import saved_from_outside
from passkit.frontends.capture import program_from_function
from passkit.passes import partition_costs
from passkit.passes.functionalize import functionalize
from passkit.passes.joint import joint
from passkit.passes.partition import default_partition, torch_min_cut
from passkit.passes.partition_min_cut import min_cut

BUDGETS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _mlp(x, w1, w2, w3):
    hidden = torch.nn.functional.gelu(x @ w1).sin()
    return ((hidden @ w2).tanh() @ w3).cos().sum()


def _mlp_inputs():
    torch.manual_seed(0)
    return [torch.randn(32, 64), torch.randn(64, 128, requires_grad=True),
            torch.randn(128, 128, requires_grad=True), torch.randn(128, 16, requires_grad=True)]


def _partition(partition, fn, inputs, **options):
    program = program_from_function(fn, inputs)
    for pass_ in (functionalize, joint):
        pass_(program)
    program.stats.clear()
    partition(program, **options)
    return program


def _ops(program, rule):
    return set(program.stats["recomputed"].get(rule, {}))


def _pipeline(tmp_path, name="mc", pass_name="partition.min_cut", **options) -> str:
    lines = ['[pipeline]', f'name = "{name}"', 'extends = "training-python"', 'disable = ["partition.default"]', '',
             '[[steps]]', f'pass = "{pass_name}"', 'after = "partition.default"']
    for key, value in options.items():
        lines.append(f"{key} = {value!r}".replace("'", '"'))
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_budget_one_recomputes_only_free_ops_and_saves_no_more_than_default() -> None:
    ours = _partition(min_cut, _mlp, _mlp_inputs())
    default = _partition(default_partition, _mlp, _mlp_inputs())
    assert set(ours.stats["recomputed"]) <= {"free"}
    assert ours.stats["recompute_ms"] == 0.0
    assert ours.stats["saved_bytes"] <= default.stats["saved_bytes"]


def test_fused_pointwise_recomputes_pointwise_chains_at_no_cost_and_saves_less() -> None:
    plain = _partition(min_cut, _mlp, _mlp_inputs())
    fused = _partition(min_cut, _mlp, _mlp_inputs(), fused_pointwise=True)
    assert fused.stats["recompute_ms"] == 0.0
    assert set(fused.stats["recomputed"]) == {"free"}
    # In gelu(x @ w1).sin() @ w2, gelu is read only by sin: recomputed in the backward, it fuses
    # into sin's backward kernel. sin's value is read by a matmul, which needs it written out
    # (a kernel of its own), so it is saved, as without fusion.
    assert "aten.gelu.default" in fused.stats["recomputed"]["free"]
    assert "aten.sin.default" not in fused.stats["recomputed"]["free"]
    assert not {"aten.gelu.default", "aten.sin.default"} & set(plain.stats["recomputed"].get("free", {}))
    assert fused.stats["saved_bytes"] < plain.stats["saved_bytes"]
    # A matmul is never pointwise: under a limit it still costs its time.
    limited = _partition(min_cut, _mlp, _mlp_inputs(), fused_pointwise=True, memory_budget=0.0)
    assert limited.stats["recompute_ms"] > 0 and "aten.mm.default" in limited.stats["recomputed"]["memory_budget"]


def _positional_mask(x, w):
    # A causal mask from positions, as the attention set's row blocks build it: the backward of
    # ``where`` needs the mask again.
    rows = torch.arange(x.shape[0]).unsqueeze(1)
    hidden = torch.arange(x.shape[1]) > rows
    return torch.where(hidden, 0.0, (x @ w).sin()).exp().sum()


def test_fused_pointwise_recomputes_a_factory_inside_the_backward_and_never_saves_it() -> None:
    inputs = [torch.randn(64, 64), torch.randn(64, 64, requires_grad=True)]
    plain = _partition(min_cut, _positional_mask, inputs)
    fused = _partition(min_cut, _positional_mask, inputs, fused_pointwise=True)
    # Unfused, the positions (512 B) are the cheapest value to keep; fused, computing them in
    # the kernel that reads them costs nothing, so no mask or position is written out for the
    # backward, and no kernel is built to write it.
    assert "aten.arange.default" not in plain.stats["recomputed"].get("free", {})
    assert {"aten.arange.default", "aten.gt.Tensor"} <= set(fused.stats["recomputed"]["free"])
    assert fused.stats["recompute_ms"] == 0.0
    assert fused.stats["saved_bytes"] < plain.stats["saved_bytes"]


def test_a_budget_allows_the_same_bytes_with_fused_pointwise_and_buys_a_faster_plan() -> None:
    # The scale ends at the fastest unfused plan, so `training` and `training-python` read a
    # budget as the same bytes; free pointwise recomputation then makes the plan under it faster.
    unfused = {b: _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=b, time_slack=0.0).stats for b in BUDGETS}
    low, high = unfused[0.0]["saved_bytes"], unfused[1.0]["saved_bytes"]
    fused_fastest = _partition(min_cut, _mlp, _mlp_inputs(), fused_pointwise=True).stats
    assert fused_fastest["saved_bytes"] < high
    for budget in (0.25, 0.5, 0.75):
        fused = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=budget, fused_pointwise=True, time_slack=0.0).stats
        assert fused["saved_bytes"] <= low + budget * (high - low)
        assert fused["recompute_ms"] <= unfused[budget]["recompute_ms"]
    # At 0.75 the fused fastest plan fits the limit: nothing that costs time is recomputed.
    assert fused["saved_bytes"] == fused_fastest["saved_bytes"] and fused["recompute_ms"] == 0.0


def test_budget_zero_saves_the_fewest_bytes_and_lower_budgets_save_less() -> None:
    saved = {b: _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=b).stats for b in BUDGETS}
    # torch saves only inputs at 0; saving the 16 KiB product x @ w1 instead of x and w1 (40 KiB) is smaller.
    assert saved[0.0]["saved_bytes"] < _partition(torch_min_cut, _mlp, _mlp_inputs(), memory_budget=0.0).stats["saved_bytes"]
    assert saved[0.0]["activation_bytes"] == 16 * 1024 < saved[1.0]["activation_bytes"]
    assert saved[0.0]["recomputed"]["memory_budget"]  # named by the rule that made it recompute
    sizes = [saved[b]["saved_bytes"] for b in BUDGETS]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    times = [saved[b]["recompute_ms"] for b in BUDGETS]
    assert times == sorted(times, reverse=True)


def _head(x, w1, w2):
    # The first gradient op, tangent @ w2.T, needs no recomputed value; w2's gradient does.
    return (torch.nn.functional.gelu(x @ w1).sin() @ w2).sum()


def test_the_backward_recomputes_each_value_just_before_its_first_use() -> None:
    program = _partition(min_cut, _head, _mlp_inputs()[:3], memory_budget=0.0)
    backward = program.graphs["backward"]
    tangents = {n for n in backward.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")}
    body = [n for n in backward.graph.nodes if n.op == "call_function"]
    from_tangents = set(tangents)
    for node in body:
        if any(a in from_tangents for a in node.all_input_nodes):
            from_tangents.add(node)
    recomputed = [n for n in body if n not in from_tangents]
    assert recomputed, "budget 0 recomputes"
    for node in recomputed:
        # The first gradient op after a recomputed value reads it (directly or through more
        # recomputation): none waits in between on a value it does not need.
        after = body[body.index(node) + 1:]
        first_gradient_op = next(n for n in after if n in from_tangents)
        needs, stack = set(), list(first_gradient_op.all_input_nodes)
        while stack:
            current = stack.pop()
            if current not in needs and current in recomputed:
                needs.add(current)
                stack.extend(current.all_input_nodes)
        assert node in needs, f"{node.name} is recomputed before {first_gradient_op.name}, which does not need it"


@pytest.mark.parametrize("budget", BUDGETS)
def test_gradients_equal_eager_for_every_budget(budget: float, tmp_path) -> None:
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 16))
    twin = copy.deepcopy(eager)
    compiled = passkit.aot_module(twin, pipeline=_pipeline(tmp_path, memory_budget=budget))
    x = torch.randn(8, 16)
    for module, runner in ((eager, eager), (twin, compiled)):
        torch.manual_seed(7)
        (runner(x) ** 2).sum().backward()
    for p_eager, p_twin in zip(eager.parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad)


def _dropout_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 16))


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.75])
def test_torch_min_cut_saves_dropout_masks_so_gradients_equal_eager(budget: float, tmp_path) -> None:
    # torch's partitioner knows native_dropout but not the bernoulli CPU dropout draws: below
    # 0.75 it recomputed the mask in the backward, a fresh draw (gradients off by up to 9).
    eager = _dropout_mlp()
    twin = copy.deepcopy(eager)
    compiled = passkit.aot_module(twin, pipeline=_pipeline(tmp_path, pass_name="partition.torch_min_cut", memory_budget=budget))
    x = torch.randn(8, 16)
    for runner in (eager, compiled):
        torch.manual_seed(7)
        (runner(x) ** 2).sum().backward()
    for p_eager, p_twin in zip(eager.parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad)


def test_torch_min_cut_at_budget_zero_refuses_to_draw_dropout_twice(tmp_path) -> None:
    path = _pipeline(tmp_path, pass_name="partition.torch_min_cut", memory_budget=0.0)
    with pytest.raises(passkit.PassError) as info:
        passkit.aot_module(_dropout_mlp(), pipeline=path, repro_dir=str(tmp_path / "repro"))(torch.randn(8, 16))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"{path}: steps[0] (partition.torch_min_cut) failed: PassError: partition.torch_min_cut: torch's plan at "
        "memory_budget = 0.0 recomputes random op aten.bernoulli.p in the backward, which would draw other numbers "
        "than the forward did; use partition.min_cut, or a budget above 0"
    )


def test_random_ops_are_never_recomputed_even_when_listed() -> None:
    def fn(x, w):
        return torch.nn.functional.dropout((x @ w).sin(), 0.5).cos().sum()

    program = _partition(min_cut, fn, [torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)],
                         memory_budget=0.0, recompute=["aten.native_dropout"])
    recomputed = {op for ops in program.stats["recomputed"].values() for op in ops}
    assert recomputed and not {op for op in recomputed if "dropout" in op or "rand" in op or "bernoulli" in op}


def _attention(dropout_p):
    def fn(x, w):
        q, k, v = (x @ w).chunk(3, dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        return (out**2).sum()

    return fn


def _attention_inputs():
    torch.manual_seed(0)
    return [torch.randn(2, 4, 16, 8), torch.randn(8, 24, requires_grad=True)]


def test_attention_without_dropout_is_recomputed_and_with_dropout_kept() -> None:
    # Fused attention is tagged random for its dropout; with dropout_p = 0 it draws nothing.
    quiet = _partition(min_cut, _attention(0.0), _attention_inputs(), memory_budget=0.0)
    recomputed = {op for ops in quiet.stats["recomputed"].values() for op in ops}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in recomputed
    noisy = _partition(min_cut, _attention(0.3), _attention_inputs(), memory_budget=0.0)
    recomputed = {op for ops in noisy.stats["recomputed"].values() for op in ops}
    assert not {op for op in recomputed if "attention" in op}
    assert quiet.stats["saved_bytes"] < noisy.stats["saved_bytes"]


def test_recomputed_attention_gives_eager_gradients(tmp_path) -> None:
    x, w = _attention_inputs()
    twin = w.detach().clone().requires_grad_()
    _attention(0.0)(x, w).backward()
    passkit.compile(_attention(0.0), pipeline=_pipeline(tmp_path, memory_budget=0.0))(x, twin).backward()
    torch.testing.assert_close(twin.grad, w.grad)


def test_max_saved_gives_the_fastest_plan_within_the_limit_measured_from_outside(tmp_path) -> None:
    low = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.0).stats["saved_bytes"]
    high = _partition(min_cut, _mlp, _mlp_inputs()).stats["saved_bytes"]
    limit = (low + high) // 2
    program = _partition(min_cut, _mlp, _mlp_inputs(), max_saved=limit)
    assert low <= program.stats["saved_bytes"] <= limit
    assert 0 < program.stats["recompute_ms"]
    compiled = passkit.aot_function(_mlp, pipeline=_pipeline(tmp_path, max_saved=f"{limit / 1024}KiB"))
    compiled(*_mlp_inputs()).backward()  # compiles outside the hooks
    measured = saved_from_outside(lambda: compiled(*_mlp_inputs()).backward())
    assert measured <= limit


def test_a_limit_between_frontier_plans_buys_a_faster_plan_that_fits() -> None:
    # The exact cuts of this MLP jump from 114 KiB to 144 KiB; plans in the gap save part of the larger one.
    plans = {b: _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=b, time_slack=0.0).stats for b in (0.0, 0.6, 0.8, 1.0)}
    low, high = plans[0.0]["saved_bytes"], plans[1.0]["saved_bytes"]
    assert plans[0.6]["saved_bytes"] < plans[0.8]["saved_bytes"] <= low + 0.8 * (high - low)
    assert plans[1.0]["recompute_ms"] < plans[0.8]["recompute_ms"] < plans[0.6]["recompute_ms"]


def test_a_limit_just_under_a_plan_recomputes_one_value_of_it() -> None:
    fastest = _partition(min_cut, _mlp, _mlp_inputs()).stats
    # One byte under the fastest plan: recompute one 2 KiB value of it (the last product, cos's input),
    # not fall back to the 16 KiB smaller frontier plan below it.
    just_under = _partition(min_cut, _mlp, _mlp_inputs(), max_saved=fastest["saved_bytes"] - 1, time_slack=0.0).stats
    assert just_under["saved_bytes"] == fastest["saved_bytes"] - 2048
    assert just_under["recomputed"]["max_saved"] == {"aten.mm.default": 1}


def _conv_bn(x, w1, g1, b1, w2, g2, b2, w3, g3, b3, lw, lb, m1, v1, m2, v2, m3, v3):
    F = torch.nn.functional
    h = F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), m1, v1, g1, b1, training=True))
    h = F.relu(F.batch_norm(F.conv2d(h, w2, padding=1), m2, v2, g2, b2, training=True))
    h = F.relu(F.batch_norm(F.conv2d(h, w3, padding=1), m3, v3, g3, b3, training=True))
    return F.linear(h.mean((2, 3)), lw, lb).logsumexp(-1).mean()


def _conv_bn_inputs():
    torch.manual_seed(0)
    params, stats = [], []
    for c_in, c_out in ((3, 32), (32, 64), (64, 64)):
        params += [torch.randn(c_out, c_in, 3, 3, requires_grad=True), torch.rand(c_out, requires_grad=True),
                   torch.randn(c_out, requires_grad=True)]
        stats += [torch.zeros(c_out), torch.ones(c_out)]
    head = [torch.randn(10, 64, requires_grad=True), torch.randn(10, requires_grad=True)]
    return [torch.randn(16, 3, 32, 32), *params, *head, *stats]


def _partition_as_training(**options):
    """Partitioned as the shipped ``training`` pipeline does: Inductor's decompositions first
    (a batch norm becomes ``var_mean`` and pointwise ops), pointwise recomputation free."""
    from passkit.core.registry import get_registry

    program = program_from_function(_conv_bn, _conv_bn_inputs())
    functionalize(program)
    decompose = get_registry().get_pass("decompose")
    decompose.run(program, decompose.options(registry=get_registry(), tables=["inductor"]))
    joint(program)
    program.stats.clear()
    min_cut(program, fused_pointwise=True, **options)
    return program.stats


def test_a_limit_a_few_statistics_under_a_plan_recomputes_the_statistics_not_a_convolution() -> None:
    # The frontier plan that saves the middle convolution's output (4 MiB) and the batch norms'
    # statistics (a few hundred bytes each) sits just above this limit. Recomputing statistics
    # meets it at little cost; dropping that 4 MiB output instead (the best time per byte freed)
    # leads to a plan that saves 2.4 MiB and costs 2.4x the estimated recompute time.
    smallest = _partition_as_training(memory_budget=0.0)
    fastest = _partition_as_training()
    limit = int(smallest["saved_bytes"] + 0.25 * (fastest["saved_bytes"] - smallest["saved_bytes"]))
    plan = _partition_as_training(max_saved=limit, time_slack=0.0)
    assert 4 * 2**20 < plan["saved_bytes"] <= limit
    assert "aten.var_mean.correction" in plan["recomputed"]["max_saved"]
    assert plan["recompute_ms"] < 0.5 * smallest["recompute_ms"]


def test_time_slack_trades_time_nobody_can_measure_for_fewer_bytes() -> None:
    exact = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.8, time_slack=0.0).stats
    lenient = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.8, time_slack=1.0).stats
    smallest = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.0).stats
    assert lenient["saved_bytes"] == smallest["saved_bytes"] < exact["saved_bytes"]
    assert lenient["recompute_ms"] > exact["recompute_ms"]
    # With no limit the fastest plan stands, whatever the slack.
    assert _partition(min_cut, _mlp, _mlp_inputs(), time_slack=1.0).stats["recompute_ms"] == 0.0


def test_the_cpu_fused_attention_is_costed_by_its_flops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph, mode = torch.fx.Graph(), FakeTensorMode()
    with mode:
        query = torch.empty(8, 8, 128, 32)
    placeholder = graph.placeholder("query")
    placeholder.meta["val"] = query
    attention = graph.call_function(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, (placeholder,) * 3)
    with mode:
        attention.meta["val"] = attention.target(query, query, query)
    flops = 4 * 8 * 8 * 128 * 128 * 32  # two (T x D) by (D x T) products per head
    assert partition_costs.estimator_for("flops")(attention) == pytest.approx(flops / 5e10 + 3e-6)


def test_an_impossible_max_saved_is_a_one_line_error(tmp_path) -> None:
    low = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.0).stats["saved_bytes"]
    with pytest.raises(passkit.PassError) as info:
        _partition(min_cut, _mlp, _mlp_inputs(), max_saved="1KiB")
    assert str(info.value) == (
        f"partition.min_cut: max_saved = '1KiB' cannot be met; the smallest limit this program can meet is "
        f"{low / 1024:.2f} KiB ({low} bytes)"
    )
    path = _pipeline(tmp_path, max_saved="1KiB")
    with pytest.raises(passkit.PassError) as info:
        passkit.aot_function(_mlp, pipeline=path, repro_dir=str(tmp_path / "repro"))(*_mlp_inputs())
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{path}: steps[0] (partition.min_cut) failed: PassError: partition.min_cut: max_saved")


def test_file_lists_change_the_saved_set() -> None:
    base = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.0)
    assert "aten.sin.default" in _ops(base, "memory_budget")
    kept = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.0, never_recompute=["aten.sin"])
    assert "aten.sin.default" not in {op for ops in kept.stats["recomputed"].values() for op in ops}
    assert kept.stats["activation_bytes"] > 0
    saved_mm = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.0, save=["aten.mm.default"])
    assert "aten.mm.default" not in {op for ops in saved_mm.stats["recomputed"].values() for op in ops}
    assert saved_mm.stats["saved"] > base.stats["saved"]
    forced = _partition(min_cut, _mlp, _mlp_inputs(), recompute=["aten.tanh"])
    assert _ops(forced, "recompute") == {"aten.tanh.default"}


def test_save_applies_to_each_output_of_a_multi_output_op() -> None:
    def fn(x, w):
        return torch.nn.functional.layer_norm(x @ w, (32,)).sin().sum()

    inputs = [torch.randn(8, 16), torch.randn(16, 32, requires_grad=True)]
    base = _partition(min_cut, fn, inputs, memory_budget=0.0)
    assert "aten.native_layer_norm.default" in _ops(base, "memory_budget")
    saved = _partition(min_cut, fn, inputs, memory_budget=0.0, save=["aten.native_layer_norm"])
    assert "aten.native_layer_norm.default" not in {op for ops in saved.stats["recomputed"].values() for op in ops}
    assert saved.stats["saved"] > base.stats["saved"]


class _Region(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.region = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh())
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.run_region(x)).cos()

    def run_region(self, x: torch.Tensor) -> torch.Tensor:
        return self.region(x)


class _CheckpointedRegion(_Region):
    def run_region(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.region, x, use_reentrant=False)


def _train(model: nn.Module, pipeline: str | None, x: torch.Tensor):
    torch._dynamo.reset()
    runner = model if pipeline is None else passkit.compile(model, pipeline=pipeline)
    runner(x).sum().backward()  # compiles
    model.zero_grad()
    measured = saved_from_outside(lambda: runner(x).sum().backward())
    if pipeline is None:
        return measured, None
    (report,) = runner.passkit_reports
    return measured, next(r.stats for r in report.records if r.id.startswith("partition.") and r.status == "ran")


def test_checkpoint_tags_and_file_policies_agree_with_torch_utils_checkpoint(tmp_path) -> None:
    torch.manual_seed(0)
    plain = _Region()
    tagged = _CheckpointedRegion()
    tagged.load_state_dict(plain.state_dict())
    x = torch.randn(4, 16, requires_grad=True)
    # Eager checkpointing packs the region's tensors under its own hooks, hidden from ours; torch's
    # partitioner reads the same tags as passkit's, so its plan is the reference.
    torch_checkpoint, _ = _train(copy.deepcopy(tagged), _pipeline(tmp_path, "torch", "partition.torch_min_cut"), x)
    from_tags, tag_stats = _train(copy.deepcopy(tagged), _pipeline(tmp_path, "tags"), x)
    from_file, file_stats = _train(copy.deepcopy(plain), _pipeline(tmp_path, "file", recompute_modules=["region"]), x)
    unchecked, plain_stats = _train(copy.deepcopy(plain), _pipeline(tmp_path, "plain"), x)
    assert set(tag_stats["recomputed"]) >= {"checkpoint"} and "checkpoint" not in file_stats["recomputed"]
    assert tag_stats["recomputed"]["checkpoint"] == file_stats["recomputed"]["recompute_modules"]
    assert from_tags == from_file == torch_checkpoint < unchecked
    assert tag_stats["saved_bytes"] == file_stats["saved_bytes"] < plain_stats["saved_bytes"]


def test_the_report_row_names_bytes_count_time_and_rules(tmp_path) -> None:
    compiled = passkit.aot_function(_mlp, pipeline=_pipeline(tmp_path, memory_budget=0.5, recompute=["aten.tanh"]))
    compiled(*_mlp_inputs()).backward()
    (report,) = compiled.passkit_reports
    row = next(r for r in report.records if r.id == "partition.min_cut")
    assert list(row.stats) == ["saved", "saved_bytes", "activation_bytes", "recompute_ms", "recomputed"]
    assert row.stats["recomputed"]["recompute"] == {"aten.tanh.default": 1}
    assert "saved=" in report.table() and "recomputed={" in report.table()


def test_the_profile_estimator_times_each_op_once_and_caches_it() -> None:
    partition_costs.clear_profile_cache()
    first = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.5, estimator="profile")
    measured = partition_costs.profile_cache_size()
    assert measured > 0
    again = _partition(min_cut, _mlp, _mlp_inputs(), memory_budget=0.5, estimator="profile")
    assert partition_costs.profile_cache_size() == measured  # same ops, shapes and device: cache hits
    assert first.stats["recompute_ms"] == again.stats["recompute_ms"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("memory_budget", 1.5, "memory_budget: must be between 0 and 1"),
        ("max_saved", "2 parsecs", "max_saved: must be a size such as '2GiB', '512MiB' or a number of bytes, not '2 parsecs'"),
        ("estimator", "guess", "estimator: Input should be 'flops' or 'profile'"),
        ("time_slack", 2, "time_slack: Input should be less than or equal to 1"),
        ("save", ["aten.not_an_op"], "save: no op named 'aten.not_an_op'"),
        ("never_recompute", ["mm"], "never_recompute: 'mm' is not an op name such as 'aten.mm' or 'aten.mm.default'"),
    ],
)
def test_options_are_validated_with_one_line_errors(tmp_path, option, value, message) -> None:
    path = _pipeline(tmp_path, **{option: value})
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(path)
    assert str(info.value) == f"{path}: steps[0] (partition.min_cut).{message}"


def test_recompute_and_save_of_one_op_is_rejected(tmp_path) -> None:
    path = _pipeline(tmp_path, recompute=["aten.mm"], save=["aten.mm"])
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(path)
    assert str(info.value) == f"{path}: steps[0] (partition.min_cut): 'aten.mm' is in both recompute and save"


def test_symbolic_sizes_use_their_hints() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda t, w: (t @ w).sin(), tracing_mode="symbolic")(torch.randn(6, 4), torch.randn(4, 5))
    mm, sin = (next(n for n in gm.graph.nodes if n.target is op) for op in (torch.ops.aten.mm.default, torch.ops.aten.sin.default))
    assert isinstance(sin.meta["val"].shape[0], torch.SymInt)
    assert partition_costs.node_bytes(sin) == 6 * 5 * 4
    flops = partition_costs.estimator_for("flops")
    assert flops(mm) > 0 and flops(sin) > 0
    assert partition_costs.estimator_for("profile")(mm) > 0
