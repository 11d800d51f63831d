"""codegen.triton's launch path: plans cached per shape, device guard, long rows, 2**31 elements.

What a GPU would be handed is checked on fake CUDA tensors (``FakeTensorMode``, device
``"cuda"``); the kernels' numerics run in Triton's interpreter without a GPU. Tests marked
``gpu`` need CUDA and are skipped without it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from triton_helpers import assert_close, gpu, launchers, require_module

import passkit
from passkit_triton import codegen_triton, fuse_regions, launch
from passkit_triton.launch import RegionLauncher

require_module("triton")
pytestmark = [
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 2, dim=-1)


def test_a_call_with_known_shapes_reuses_its_plan(triton_compile, device, monkeypatch) -> None:
    program = triton_compile(softmax, torch.randn(4, 8, device=device))
    (launcher,) = launchers(program)
    planned = []
    plan = RegionLauncher.plan
    monkeypatch.setattr(RegionLauncher, "plan", lambda self, *inputs: planned.append(1) or plan(self, *inputs))

    x, y = torch.randn(4, 8, device=device), torch.randn(8, 4, device=device).t()
    for inputs in (x, x + 1, x * 2, y, y * 2):
        assert_close(program.compiled["main"](inputs)[0], softmax(inputs))
    assert len(planned) == 2  # once per layout: sizes and strides are not walked again
    assert (launcher.calls, launcher.fallbacks) == (5, 0)


def test_block_shapes_come_from_the_sizes_without_timing(triton_compile, device, monkeypatch) -> None:
    assert codegen_triton.options().autotune is False
    monkeypatch.setattr(RegionLauncher, "_time", lambda *a, **k: pytest.fail("timed a kernel inside a call"))
    x = torch.randn(32, 40, device=device)
    program = triton_compile(softmax, x)  # the pass's default options

    assert_close(program.compiled["main"](x)[0], softmax(x))
    (launcher,) = launchers(program)
    assert launcher.chosen == {(32, 64): launcher._candidates(32, 40)[0]}


def fake_cuda(*shape: int, index: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device=f"cuda:{index}", dtype=dtype)


def test_a_tensor_on_the_second_gpu_launches_on_it(triton_compile, monkeypatch) -> None:
    program = triton_compile(softmax, torch.randn(4, 8))
    (launcher,) = launchers(program)
    monkeypatch.setattr(launch, "_current_cuda_device", lambda: 0)
    # The guard itself: torch.cuda.device(1) when device 0 is current, nothing when it is 1.
    guard = launch._device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(launch._device_guard(torch.device("cuda", 0)), contextlib.nullcontext)

    current = [0]

    @contextlib.contextmanager
    def recording_guard(device: torch.device):
        previous, current[0] = current[0], device.index
        yield
        current[0] = previous

    launched = []
    monkeypatch.setattr(launch, "_device_guard", recording_guard)
    monkeypatch.setattr(launch, "_shape_key", lambda inputs: tuple((t.shape, t.stride(), t.device) for t in inputs))
    monkeypatch.setattr(RegionLauncher, "_launch", lambda self, plan, args, *rest: launched.append((current[0], plan, args)))
    # Where CUDA is present, a fake tensor's first use of a device opens a context on the real
    # one, and a one-GPU machine has no cuda:1.
    monkeypatch.setattr(fake_tensor, "init_gpu_context", lambda device: None)
    with FakeTensorMode():
        (out,) = launcher(fake_cuda(4, 8, index=1))
    (device, plan, args), = launched
    assert device == 1 and out.device == torch.device("cuda", 1)
    assert plan.device == torch.device("cuda", 1) and args[1] is out and launcher.fallbacks == 0


def symbolic_launcher(fn, *inputs: torch.Tensor) -> RegionLauncher:
    """The one region launcher of ``fn`` traced with symbolic sizes (any shape runs it)."""
    gm = make_fx(fn, tracing_mode="symbolic")(*inputs)
    program = passkit.Program(graphs={"main": gm}, signature=None, example_inputs=[], facts={"functional"})
    fuse_regions(program)
    codegen_triton(program)
    (launcher,) = launchers(program)
    return launcher


def spelled_softmax(x: torch.Tensor) -> torch.Tensor:
    shifted = x * 2 - (x * 2).amax(-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(-1, keepdim=True)


def test_two_gigaelement_tensors_use_int64_offsets() -> None:
    launcher = symbolic_launcher(spelled_softmax, torch.randn(4, 8))
    with FakeTensorMode():
        small = launcher.plan(fake_cuda(4, 8, dtype=torch.bfloat16))
        huge = launcher.plan(fake_cuda(2**17 + 1, 2**14, dtype=torch.bfloat16))  # 2**31 + 2**14 elements
    assert small is not None and not small.spec.wide
    assert huge is not None and huge.spec.wide and not huge.spec.looped
    assert "rows = tl.program_id(0).to(tl.int64) * BLOCK_M" in huge.spec.source
    assert huge.grid == (2**17 + 1, 1)


def test_the_int64_kernel_matches_eager(triton_compile, device, monkeypatch) -> None:
    monkeypatch.setattr(launch, "_INT32_LIMIT", 64)  # small tensors take the wide kernel here
    x = torch.randn(5, 300, device=device)
    program = triton_compile(softmax, x, max_row=128)
    (launcher,) = launchers(program)

    assert_close(program.compiled["main"](x)[0], softmax(x))
    (plan,) = launcher.plans.values()
    assert plan.spec.wide and plan.spec.looped and launcher.fallbacks == 0


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return (x - mean) * rstd * w + b, mean, rstd


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


LOOPED = {
    "sum_flat": lambda x: (x * x).sum(-1).sqrt(),
    "mean_epilogue": lambda x: (x - x.mean(-1, keepdim=True)).relu() * 2,
    "unbiased_var": lambda x: torch.var_mean(x * 3, dim=-1, keepdim=True, correction=1),
    "amin_and_amax": lambda x: (x * 2).amin(-1) - (x * 2).amax(-1),
    "log_softmax": lambda x: torch.log_softmax(x * 2, -1),
}


@pytest.mark.parametrize("name", list(LOOPED))
def test_every_reduction_has_a_looped_kernel(triton_compile, device, name) -> None:
    fn = LOOPED[name]
    x = torch.randn(3, 2, 100, device=device)
    program = triton_compile(fn, x, max_row=16, block_sizes=[32])
    expected = fn(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for actual, wanted in zip(program.compiled["main"](x), expected, strict=True):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-5)
    plans = [plan for launcher in launchers(program) for plan in launcher.plans.values()]
    assert plans and all(plan.spec.looped and plan.config.block_n == 32 for plan in plans)


@pytest.mark.slow
def test_rows_of_forty_thousand_run_the_looped_kernel(triton_compile, device) -> None:
    torch.manual_seed(0)
    row = 40_000  # longer than max_row (16384): an LM head's vocabulary
    x, w, b = torch.randn(2, row, device=device), torch.randn(row, device=device), torch.randn(row, device=device)
    target = torch.randint(0, row, (2,), device=device)
    cases = [(softmax, (x,)), (layer_norm, (x, w, b)), (cross_entropy, (x * 4, target))]
    for fn, inputs in cases:
        program = triton_compile(fn, *inputs, block_sizes=[4096])
        expected = fn(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for actual, wanted in zip(program.compiled["main"](*inputs), expected):
            torch.testing.assert_close(actual, wanted, rtol=1e-4, atol=1e-5)
        for launcher in launchers(program):
            assert launcher.fallbacks == 0
            for plan in launcher.plans.values():
                if plan.spec.has_reduction:
                    assert plan.spec.looped and plan.config.block_n == 4096 and plan.grid[1] == 1
                    assert "for off in range(0, N, BLOCK_N):" in plan.spec.source


@gpu
def test_a_launch_costs_microseconds_and_binds_the_compiled_kernel(triton_compile) -> None:
    x = torch.randn(64, 256, device="cuda")
    program = triton_compile(softmax, x)
    run = program.compiled["main"]
    (launcher,) = launchers(program)
    for _ in range(3):
        run(x)
    torch.cuda.synchronize()
    (plan,) = launcher.plans.values()
    assert plan.bound is not None  # later calls skip Triton's JIT dispatch
    samples = []
    for _ in range(200):
        started = time.perf_counter()
        launcher(x)
        samples.append(time.perf_counter() - started)
    torch.cuda.synchronize()
    assert statistics.median(samples) < 30e-6, statistics.median(samples)
    assert_close(run(x)[0], softmax(x))


@gpu
def test_a_cuda_graph_captures_the_kernels(triton_compile) -> None:
    x = torch.randn(64, 256, device="cuda")
    program = triton_compile(softmax, x)
    run = program.compiled["main"]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            run(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (out,) = run(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, softmax(x))


@gpu
def test_a_tensor_on_the_second_gpu_computes_there(triton_compile) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(16, 64, device="cuda:1")
    program = triton_compile(softmax, x)
    with torch.cuda.device(0):
        (out,) = program.compiled["main"](x)
    assert out.device == x.device
    assert_close(out, softmax(x))


class FakeBinary:
    """What Triton's JIT returns for a compiled kernel, as far as the launcher reads it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.function, self.packed_metadata = "cu-function", "packed"

    def launch_metadata(self, *args):
        return None

    @property
    def run(self):
        return lambda *args: self.calls.append(args)


def test_a_bound_launch_calls_the_compiled_kernel_directly(monkeypatch) -> None:
    from triton.runtime.driver import driver

    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=lambda index: 7000 + index))
    binary = FakeBinary()
    bound = launch._bind(binary, (12, 3), torch.device("cuda", 1))
    assert bound is not None
    bound(["in0", "out0", 4, 8], launch.Config(block_m=2, block_n=64, num_warps=4))
    # Triton 3.3+: grid, stream, function, metadata, launch metadata and hooks, then every argument.
    assert binary.calls == [(12, 3, 1, 7001, "cu-function", "packed", None, None, None, "in0", "out0", 4, 8, 2, 64)]
    # A profiler's launch hook: launches stay with the JIT, which calls it.
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    assert launch._bind(binary, (12, 3), torch.device("cuda", 1)) is None


def test_a_refused_bound_launch_goes_back_to_the_jit(triton_compile, device, monkeypatch) -> None:
    x = torch.randn(4, 8, device=device)
    program = triton_compile(softmax, x)
    (launcher,) = launchers(program)
    program.compiled["main"](x)
    (plan,) = launcher.plans.values()

    def refused(args, config):
        raise TypeError("function takes exactly 20 arguments (19 given)")

    plan.bound = refused
    assert_close(program.compiled["main"](x)[0], softmax(x))
    assert plan.bound is None or plan.bound is not refused
