"""codegen.triton: every kernel kind against eager, in Triton's interpreter on the CPU.

Each function below becomes one fusion region (the tests assert that), runs as one kernel
(``fallbacks == 0``) and must match eager within its dtype's tolerance. For 16-bit inputs the
reference is eager in float32, rounded once: eager in bfloat16 rounds after every op and is
itself further from the exact answer than the kernel (``dtype_policy = "keep"`` reproduces those
roundings, bit for bit, see below).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from triton_helpers import assert_close, launchers, require_module

import passkit
from passkit_triton import codegen_triton, fuse_regions, launch
from passkit_triton.launch import cache_dir

require_module("triton")
# Padding lanes of a partial block may take log(0), and NaN inputs meet NumPy in the
# interpreter; neither warning is about a result.
pytestmark = [
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    shifted = x - x.amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True).log()


def layer_norm_stats(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return (x - mean) * rstd * w + b, mean, rstd


def mean_epilogue(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(-1, keepdim=True)).relu() * 2


def row_sum_flat(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(-1).sqrt()  # no keepdim: a (rows,) result


def broadcast_pointwise(x: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x + bias) * scale - torch.tanh(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def masked_fill(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, x * 3, float("-inf")).exp()


CASES = [
    ("softmax", softmax, lambda dt: (torch.randn(6, 5, 37, dtype=dt),), "reduction"),
    ("log_softmax", log_softmax, lambda dt: (torch.randn(9, 100, dtype=dt),), "reduction"),
    (
        "layer_norm",
        layer_norm_stats,
        lambda dt: (torch.randn(3, 7, 48, dtype=dt), torch.randn(48, dtype=dt), torch.randn(48, dtype=dt)),
        "reduction",
    ),
    ("mean_epilogue", mean_epilogue, lambda dt: (torch.randn(20, 33, dtype=dt),), "reduction"),
    ("row_sum_flat", row_sum_flat, lambda dt: (torch.randn(4, 3, 10, dtype=dt),), "reduction"),
    (
        "broadcast",
        broadcast_pointwise,
        lambda dt: (torch.randn(5, 3, 70, dtype=dt), torch.randn(70, dtype=dt), torch.randn(5, 1, 1, dtype=dt)),
        "pointwise",
    ),
    ("gelu_tanh", gelu_tanh, lambda dt: (torch.randn(130, 17, dtype=dt),), "pointwise"),
    ("masked", masked_fill, lambda dt: (torch.randn(8, 8, dtype=dt), torch.rand(8, 8) > 0.3), "pointwise"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("fn", "make_inputs", "kind"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_region_kind_is_one_kernel_that_matches_eager(triton_compile, fn, make_inputs, kind, dtype, device) -> None:
    torch.manual_seed(0)
    inputs = tuple(t.to(device) for t in make_inputs(dtype))
    program = triton_compile(fn, *inputs)

    (region,) = [n.meta["fusion_region"] for n in program.graphs["main"].graph.nodes if n.op == "call_module"]
    assert region["kind"] == kind
    actual = program.compiled["main"](*inputs)
    # 16-bit eager rounds after every op; the kernel rounds once, so compare both with float32.
    expected = fn(*[t.float() if t.is_floating_point() else t for t in inputs])
    expected = expected if isinstance(expected, tuple) else (expected,)
    for a, e in zip(actual, expected):
        assert_close(a, e.to(dtype))
    (launcher,) = launchers(program)
    assert (launcher.calls, launcher.fallbacks) == (1, 0)


def test_strided_and_broadcast_inputs_are_read_through_their_strides(triton_compile, device) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a * 2 + b, dim=-1)

    a, b = torch.randn(40, 24, device=device), torch.randn(40, 1, device=device)
    program = triton_compile(fn, a, b)
    transposed, column = torch.randn(24, 40, device=device).t(), torch.randn(1, 40, device=device).t()
    every_other, strided_column = torch.randn(40, 48, device=device)[:, ::2], torch.randn(80, 2, device=device)[::2, 1:]
    assert not transposed.is_contiguous() and not every_other.is_contiguous()

    for x, y in ((a, b), (transposed, column), (every_other, strided_column), (a, b.expand(40, 24))):
        assert_close(program.compiled["main"](x, y)[0], fn(x, y))
    assert launchers(program)[0].fallbacks == 0


def test_keep_policy_rounds_each_op_like_eager(triton_compile, device) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return ((x * 1.003) * 1.003) * 1.003

    x = torch.randn(64, 64, dtype=torch.bfloat16, device=device)
    expected = fn(x)
    keep = triton_compile(fn, x, dtype_policy="keep").compiled["main"](x)[0]
    fp32 = triton_compile(fn, x, dtype_policy="fp32").compiled["main"](x)[0]

    torch.testing.assert_close(keep, expected, rtol=0, atol=0)  # bit for bit: the same roundings
    assert not torch.equal(fp32, expected)  # one rounding at the end instead of three
    assert_close(fp32, expected)


def test_autotune_times_each_block_size_once_and_remembers(triton_compile, device) -> None:
    x = torch.randn(32, 40, device=device)
    program = triton_compile(softmax, x, autotune=True, block_sizes=[64, 256], num_warps=2)
    (launcher,) = launchers(program)

    program.compiled["main"](x)
    program.compiled["main"](x)

    assert set(launcher.chosen) == {(32, 64)}
    assert launcher.chosen[(32, 64)] in [c for c in launcher._candidates(32, 40)]
    assert {(c.block_m, c.block_n) for c in launcher._candidates(32, 40)} == {(1, 64), (4, 64)}


def test_kernels_are_cached_by_source(triton_compile, tmp_path, monkeypatch, device) -> None:
    monkeypatch.setenv("PASSKIT_TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launch, "_KERNELS", {})  # forget kernels that earlier tests compiled

    def twice(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.softmax(x, -1), torch.softmax(y, -1)

    program = triton_compile(twice, torch.randn(4, 8, device=device), torch.randn(6, 8, device=device))
    first, second = launchers(program)
    assert first.spec.source == second.spec.source
    program.compiled["main"](torch.randn(4, 8, device=device), torch.randn(6, 8, device=device))
    assert cache_dir() == tmp_path
    assert len(list(tmp_path.glob("region_*.py"))) == 1
    assert launch.load_kernel(first.spec.source, "passkit_region") is launch.load_kernel(second.spec.source, "passkit_region")


def test_rows_longer_than_max_row_run_the_looped_kernel(triton_compile, device) -> None:
    x = torch.randn(3, 300, device=device)
    program = triton_compile(softmax, x, max_row=256)

    assert_close(program.compiled["main"](x)[0], softmax(x))
    (launcher,) = launchers(program)
    assert (launcher.calls, launcher.fallbacks) == (1, 0)
    (plan,) = launcher.plans.values()
    assert plan.spec.looped and plan.grid == (3, 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_sizes": [100]}, "block_sizes\n  Value error, 100 is not a power of 2"),
        ({"dtype_policy": "fp16"}, "dtype_policy\n  Input should be 'keep' or 'fp32'"),
    ],
)
def test_bad_options_are_rejected(options, message) -> None:
    from passkit_triton import codegen_triton

    with pytest.raises(Exception) as raised:
        codegen_triton.options(**options)
    assert message in str(raised.value)


def test_bad_option_in_a_pipeline_file_names_the_step(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.toml").write_text('[pipeline]\nextends = "inference-triton"\n\n[override."codegen.triton"]\nnum_warps = 0\n')
    with pytest.raises(passkit.PipelineError) as raised:
        passkit.load_pipeline("bad.toml")
    assert str(raised.value) == 'bad.toml: override."codegen.triton".num_warps: Input should be greater than or equal to 1'


def test_a_cross_entropy_loss_matches_eager(triton_compile, device) -> None:
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target)

    logits, target = torch.randn(12, 30, device=device), torch.randint(0, 30, (12,), device=device)
    program = triton_compile(loss, logits, target)
    assert_close(program.compiled["main"](logits, target)[0], loss(logits, target))


def test_an_explicit_cast_rounds_under_the_fp32_policy(triton_compile, device) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 1.003).to(torch.bfloat16).float() * 1.003

    x = torch.randn(32, 32, device=device)
    program = triton_compile(fn, x, dtype_policy="fp32")
    torch.testing.assert_close(program.compiled["main"](x)[0], fn(x), rtol=0, atol=0)


def test_empty_rows_run_their_aten_ops(device) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(-1) + 1

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(3, 4, device=device))
    program = passkit.Program(graphs={"main": gm}, signature=None, example_inputs=[], facts={"functional"})
    fuse_regions(program)
    codegen_triton(program, autotune=False)
    (launcher,) = launchers(program)
    for x in (torch.randn(5, 7, device=device), torch.randn(3, 0, device=device)):
        out = program.compiled["main"](x)
        assert_close(out[0] if isinstance(out, (tuple, list)) else out, fn(x))
    assert (launcher.calls, launcher.fallbacks) == (2, 1)


def test_cpu_tensors_without_the_interpreter_run_aten_and_warn(triton_compile, monkeypatch) -> None:
    x = torch.randn(4, 8)
    program = triton_compile(softmax, x)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(launch, "_WARNED", set())

    with pytest.warns(RuntimeWarning) as warned:
        assert_close(program.compiled["main"](x)[0], softmax(x))
    assert str(warned[0].message) == (
        "passkit-triton: fusion regions on cpu tensors run their ATen ops; kernels need CUDA, or TRITON_INTERPRET=1"
    )
    assert launchers(program)[0].fallbacks == 1


def test_bfloat16_rounding_matches_torch_bit_for_bit(triton_compile, device) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 1).to(torch.bfloat16)

    special = [0.0, -0.0, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), float("inf"), float("-inf"), 3.3961e38, 1e-40, -1e-41]
    x = torch.cat([torch.tensor(special), torch.randn(1000) * 100]).to(device)
    program = triton_compile(fn, x)

    actual = program.compiled["main"](x)[0]
    differ = (actual.view(torch.int16) != fn(x).view(torch.int16)).nonzero().flatten()
    assert differ.tolist() == [], (x[differ].tolist(), actual[differ].tolist(), fn(x)[differ].tolist())
    nans = torch.tensor([0x7FC00000, 0x7F800001, -1], dtype=torch.int32).view(torch.float32).to(device)  # payload in low bits too
    assert program.compiled["main"](nans.repeat(len(x))[: len(x)])[0].isnan().all()
