"""What ``partition.min_cut``'s cost estimators charge on a GPU, checked on fake CUDA tensors,
and the memory the ``profile`` estimator may take while a program compiles."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from passkit import _torch
from passkit.passes import partition_costs


def _mm_node(device: str, dtype: torch.dtype, n: int) -> torch.fx.Node:
    with _torch.new_fake_mode():
        a = torch.empty(n, n, device=device, dtype=dtype)
        gm = make_fx(torch.mm)(a, a)
    return next(node for node in gm.graph.nodes if node.target is torch.ops.aten.mm.default)


def test_a_gpu_matmul_is_charged_at_tensor_core_rates_in_bfloat16() -> None:
    flops = partition_costs.estimator_for("flops")
    bf16, fp32 = flops(_mm_node("cuda", torch.bfloat16, 4096)), flops(_mm_node("cuda", torch.float32, 4096))
    # 2 * 4096**3 FLOPs: about 0.17 ms on an H100/H200's bf16 tensor cores, ten times that in fp32.
    assert 1e-4 < bf16 < 3e-4
    assert 9 < fp32 / bf16 < 11


def test_the_profile_estimator_takes_no_more_memory_than_its_limit() -> None:
    # A 4096x32768 fp32 matmul would need 1.5 GiB of made-up tensors: estimated, not run.
    with _torch.new_fake_mode():
        a, b = torch.empty(4096, 32768), torch.empty(32768, 4096)
        gm = make_fx(torch.mm)(a, b)
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    partition_costs.clear_profile_cache()
    profile = partition_costs.estimator_for("profile")
    assert profile(node) == partition_costs.estimator_for("flops")(node)
    assert partition_costs.profile_cache_size() == 0


@pytest.mark.gpu
def test_the_profile_estimator_times_gpu_kernels_not_launches() -> None:
    # A 16-element add runs in a few microseconds of GPU time; timed from the host with a
    # synchronize around one launch, it took tens.
    with _torch.new_fake_mode():
        x = torch.empty(16, device="cuda")
        gm = make_fx(torch.add)(x, x)
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    partition_costs.clear_profile_cache()
    assert partition_costs.estimator_for("profile")(node) < 8e-6
    assert partition_costs.profile_cache_size() == 1
