"""``codegen.inductor``'s GPU path, checked on this CPU: what a forward and its backward share
for CUDA graphs, and failures that name the toolchain that failed."""

from __future__ import annotations

import pytest
import torch

import passkit
from passkit.passes.codegen_inductor import inductor_fallback_message


def test_a_forward_and_its_backward_share_one_cudagraphs_switch(monkeypatch) -> None:
    # torch's compile_fx gives both one BoxedBool: a forward that cannot be recorded turns
    # recording off for its backward too (else the backward re-records every step).
    from torch._inductor import compile_fx

    seen: list[tuple[bool, object, object]] = []
    real = compile_fx.compile_fx_inner

    def recording(gm, example_inputs, **kwargs):
        seen.append((kwargs["is_backward"], kwargs["cudagraphs"], kwargs["boxed_forward_device_index"]))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording)
    compiled = passkit.aot_function(lambda x: (x * 3).sin(), pipeline="training", cache="off")
    x = torch.randn(8, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 3 * (x * 3).cos().detach())
    (forward, fw_box, fw_index), (backward, bw_box, bw_index) = seen
    assert (forward, backward) == (False, True)
    assert fw_box is bw_box and fw_index is bw_index


class _TritonFailure(Exception):
    """Stands for an exception raised inside the triton package."""


_TritonFailure.__module__ = "triton.compiler.errors"


def _cpp_failure() -> Exception:
    from torch._inductor.exc import CppCompileError

    return CppCompileError(["g++", "kernel.cpp"], "kernel.cpp:3: error: expected ';'")


@pytest.mark.parametrize(
    ("make", "building_on", "advice"),
    [
        (_cpp_failure, None, "needs no C++ compiler"),
        (lambda: _TritonFailure("PassManager::run failed"), None, "needs no Triton"),
        (lambda: RuntimeError("worker died"), "cuda", "needs no Triton"),
        (lambda: RuntimeError("worker died"), "cpu", "needs no C++ compiler"),
        (lambda: AssertionError("bernoulli_ lowering"), None, "runs the graph as ATen calls, without Inductor"),
    ],
    ids=["cpp", "triton", "build-on-cuda", "build-on-cpu", "lowering"],
)
def test_an_inductor_failure_names_the_toolchain_that_failed(make, building_on, advice) -> None:
    exc = make()
    wrapped = RuntimeError("compile failed")
    wrapped.__cause__ = exc
    message = inductor_fallback_message("forward", True, wrapped, building_on=building_on)
    assert message == (
        "Inductor cannot compile the 'forward' graph (RuntimeError: compile failed); "
        f"use the 'training-python' pipeline, which {advice}"
    )


def _traced_on_fake_cuda(fn) -> torch.fx.GraphModule:
    """``fn`` traced as the GPU would run it: on fake CUDA tensors, through eager's dispatch
    (``F.dropout`` on CUDA is the fused ``native_dropout``; on the CPU it is ``bernoulli_``)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from passkit import _torch

    mode = _torch.new_fake_mode()
    with mode:
        x = torch.randn(8, 16, device="cuda")
        # Functional, as every graph codegen.inductor receives.
        return make_fx(torch.func.functionalize(fn, remove="mutations_and_views"))(x)


def _random_calls(gm: torch.fx.GraphModule) -> list[str]:
    names = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    return [name for name in names if any(word in name for word in ("rand", "bernoulli", "dropout", "inductor_"))]


def _handed_to_inductor(fn, *, fallback_random: bool) -> torch.fx.GraphModule:
    from passkit.passes.codegen_inductor import InductorOptions, _graph_for_inductor

    return _graph_for_inductor(_traced_on_fake_cuda(fn), InductorOptions(fallback_random=fallback_random))


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True) * 2


def _keep_mask(x: torch.Tensor) -> torch.Tensor:
    # A graph whose one op with a decomposition is ``bernoulli.p`` (DropPath-style masks): no
    # other op makes codegen re-trace it.
    return x * x.bernoulli(0.8)


def test_cuda_dropout_under_fallback_random_reaches_inductor_whole_to_draw_eagers_masks() -> None:
    graph = _handed_to_inductor(_dropout, fallback_random=True)
    assert _random_calls(graph) == ["aten.native_dropout.default"]


@pytest.mark.parametrize("fn", [_dropout, _keep_mask], ids=["dropout", "bernoulli"])
def test_cuda_random_ops_without_fallback_random_become_inductors_philox_random(fn) -> None:
    # As torch.compile: rand comparisons, turned into Inductor's seeded philox random as its joint
    # passes turn them. A bernoulli left whole would trip Inductor's CUDA lowering assert, and a
    # rand left whole its "should have been handled in replace_random.py".
    graph = _handed_to_inductor(fn, fallback_random=False)
    assert _random_calls(graph) == ["prims.inductor_seeds.default", "prims.inductor_lookup_seed.default", "prims.inductor_random.default"]


def test_gpu_kernels_are_waited_for_as_each_graph_compiles(monkeypatch) -> None:
    # Inductor's FX graph cache stores a graph's Triton binaries only if they are built when the
    # graph is saved: off the CPU, waits are not put off to the end of the block.
    from torch._inductor.async_compile import AsyncCompile

    from passkit import _torch

    inductors_wait = AsyncCompile.wait
    with _torch.kernels_compiled_together(device_type="cuda") as builds:
        assert AsyncCompile.wait is inductors_wait
    assert (builds.kernels, builds.libraries, builds.triton_kernels) == (0, 0, 0)
    with _torch.kernels_compiled_together(device_type="cpu"):
        assert AsyncCompile.wait is not inductors_wait
    assert AsyncCompile.wait is inductors_wait


class _MaskedLayer(torch.nn.Module):
    """A layer that reads a mask needing no gradient: its body's backward returns None for it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.out_norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.gelu(self.up(self.norm(x))).masked_fill(mask, 0.0)
        x = x + self.down(hidden)
        return x + 0.1 * torch.tanh(self.out_norm(x))


class _MaskedStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_MaskedLayer() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x[..., :1] > 1.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


@pytest.mark.parametrize("region_calls", ["python", "inductor"])
def test_a_body_with_no_gradient_for_an_operand_compiles_with_gpu_padding(tmp_path, region_calls) -> None:
    # On a GPU, Inductor pads strides (comprehensive_padding, off on the CPU) and reads the strides
    # of every output marked visible; a None gradient marked so failed GPT-2's backward there
    # ("'NoneType' object has no attribute 'target'").
    import copy

    from torch._inductor import config as inductor_config

    from tiny_programs import regions_overlay

    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(regions_overlay("training", "training-regions")
                        + f'\n[override."codegen.inductor"]\nregion_calls = "{region_calls}"\n')
    torch.manual_seed(0)
    model = _MaskedStack()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 8, 16)
    with inductor_config.patch(comprehensive_padding=True, disable_padding_cpu=False):
        compiled = passkit.compile(model, pipeline=str(pipeline), cache="off", on_error="raise")
        compiled(x).pow(2).sum().backward()
    eager(x).pow(2).sum().backward()
    regions = [r for r in compiled.passkit_reports[0].records if r.id == "regions"]
    assert regions[0].stats["repeats"], "no region was outlined"
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
