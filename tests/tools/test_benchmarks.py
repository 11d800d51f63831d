"""The benchmarks' head-to-head timing and their option errors: what a user running them sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def paired(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import paired

    return paired


def test_head_to_head_is_the_median_of_adjacent_step_ratios(paired, monkeypatch) -> None:
    # A fake clock: each step advances it by its cost times the host's slowness, which changes
    # tenfold in the middle of every A B B A block (between the two `ours` steps). No adjacent
    # pair spans a change, so every ratio is the true 1.5.
    clock = [0.0]
    slowness = [1.0]
    monkeypatch.setattr(paired.time, "perf_counter", lambda: clock[0])
    ours_calls = [0]

    def theirs() -> None:
        clock[0] += 2.0 * slowness[0]

    def ours() -> None:
        ours_calls[0] += 1
        if ours_calls[0] % 2 == 0:
            slowness[0] = 11.0 - slowness[0]  # 1 -> 10 -> 1
        clock[0] += 3.0 * slowness[0]

    ratio = paired.head_to_head(ours, theirs, repetitions=4)
    assert ratio.pairs == 8
    assert ratio.median == pytest.approx(1.5)


def test_head_to_head_keeps_pairing_until_its_minimum_time(paired, monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(paired.time, "perf_counter", lambda: clock[0])

    def step() -> None:
        clock[0] += 0.25

    ratio = paired.head_to_head(step, step, repetitions=1, min_seconds=10.0)
    assert ratio.pairs == 20  # ten A B B A blocks of one second each
    assert (ratio.q1, ratio.median, ratio.q3) == (1.0, 1.0, 1.0)


def test_head_to_head_without_repetitions_is_refused(paired) -> None:
    with pytest.raises(ValueError) as info:
        paired.head_to_head(lambda: None, lambda: None, repetitions=0)
    assert str(info.value) == "head_to_head needs at least one repetition, got 0"


@pytest.mark.parametrize("script", ["step_time.py", "memory_frontier.py"])
@pytest.mark.parametrize(("value", "message"), [
    ("-1", "argument --pairs: must be 0 or more, got -1"),
    ("x", "argument --pairs: must be a whole number, got 'x'"),
])
def test_a_bad_pairs_option_is_a_one_line_error(script, value, message) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--pairs", value],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == f"{script}: error: {message}"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize(("script", "extra"), [("step_time.py", ["--dtype", "bfloat16"]), ("compile_depth.py", [])])
def test_a_benchmark_on_cuda_without_a_gpu_is_a_one_line_error(script: str, extra: list[str]) -> None:
    import torch

    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--device", "cuda", *extra],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"{script}: error: argument --device: cuda is not available on this machine (torch {torch.__version__})"
    )


def test_call_overhead_calls_the_program_dynamo_calls_with_the_inputs_it_passes(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import call_overhead
    import torch

    import passkit
    from passkit.runtime.wrapper import CompiledProgram

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh())
    x = torch.randn(3, 8)
    compiled = passkit.compile(model, pipeline="training-python", cache="off")
    program, inputs = call_overhead.frame_inputs(compiled, x)
    assert isinstance(program, CompiledProgram)
    assert {id(t) for t in inputs} == {id(x), *(id(p) for p in model.parameters())}
    (direct,) = program(*inputs)
    torch.testing.assert_close(direct, model(x))
    assert CompiledProgram.__call__.__name__ == "__call__"  # the spy is gone


def test_compile_depth_prints_each_rounds_depth_ratio_and_their_median(monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compile_depth

    results = {
        "stack2": {"training": [{"compile_s": 2.0}, {"compile_s": 4.0}]},
        "stack24": {"training": [{"compile_s": 3.0}, {"compile_s": 5.0}]},
        "stack48": {"training": [{"compile_s": 3.9}, {"error": "failed"}]},
    }
    compile_depth.print_depth_ratios(results, ["training"])
    assert capsys.readouterr().out.splitlines() == [
        "training: stack24 / stack2 compile: median 1.38 (rounds: 1.50, 1.25)",
        "training: stack48 / stack24 compile: median 1.30 (rounds: 1.30)",  # a failed round has no ratio
    ]


def test_compile_depths_pipelines_are_training_with_the_options_asked_and_training_without_regions(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compile_depth

    import passkit

    compile_depth.write_pipelines(str(tmp_path), layers_per_region=2, trace_once=False)
    regions = next(s for s in passkit.load_pipeline(str(tmp_path / "training.toml")).steps if s.id == "regions")
    assert (regions.enabled, regions.options.layers_per_region, regions.options.trace_once) == (True, 2, False)
    compile_depth.write_pipelines(str(tmp_path))
    shipped = next(s for s in passkit.load_pipeline("training").steps if s.id == "regions")
    regions = next(s for s in passkit.load_pipeline(str(tmp_path / "training.toml")).steps if s.id == "regions")
    assert regions.options == shipped.options
    without = {s.id: s.enabled for s in passkit.load_pipeline(str(tmp_path / "training-no-regions.toml")).steps}
    assert without["regions"] is False
    assert [i for i, on in without.items() if on] == [s.id for s in passkit.load_pipeline("training").steps][1:]


def test_a_regions_overlay_adds_the_step_to_a_pipeline_without_one(monkeypatch, tmp_path) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compile_depth

    import passkit

    path = tmp_path / "overlay.toml"
    path.write_text(compile_depth.regions_overlay("training-python", trace_once=True))
    steps = passkit.load_pipeline(str(path)).steps
    assert [s.id for s in steps][:2] == ["regions", "functionalize"]
    assert steps[0].options.trace_once is True
