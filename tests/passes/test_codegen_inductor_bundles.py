"""``codegen.inductor`` builds each graph's C++ kernels as a few libraries (``bundle_kernels``),
computes what eager computes with them, and falls back to one library per kernel."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch._inductor.utils import fresh_cache

import passkit
from passkit import _torch
from passkit.examples.convnet import ConvBN

pytestmark = pytest.mark.slow  # every test here pays for g++ building kernels

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _pipeline(tmp_path: Path, bundle: bool) -> Path:
    flag = str(bundle).lower()
    path = tmp_path / f"bundle-{flag}.toml"
    path.write_text(
        f'[pipeline]\nname = "bundle-{flag}"\nextends = "training"\n\n'
        f'[override."codegen.inductor"]\nbundle_kernels = {flag}\n'
    )
    return path


def _train_with_fresh_kernels(model: torch.nn.Module, x: torch.Tensor, pipeline: Path, kernels_dir: Path,
                              **compile_kwargs: Any) -> tuple[int, int]:
    """One step through ``pipeline`` with an empty kernel cache, checked against eager;
    returns (kernels in the generated code, shared libraries built)."""
    torch._dynamo.reset()
    eager = copy.deepcopy(model)
    compiled = passkit.compile(model, pipeline=str(pipeline), cache="off", **compile_kwargs)
    kernels_dir.mkdir()
    with fresh_cache(dir=str(kernels_dir), delete=False):
        out = compiled(x)
        (out**2).mean().backward()
    expected = eager(x)
    (expected**2).mean().backward()
    torch.testing.assert_close(out, expected, **TOLERANCE)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, **TOLERANCE, msg=lambda m: f"grad {name}: {m}")
    program = compiled.passkit_backend.programs[0]
    sources = [program.compiled[g].passkit_source for g in ("forward", "backward")]
    kernels = sum(len(re.findall(r"async_compile\.cpp_pybinding\(", s)) for s in sources)
    libraries = _kernel_libraries(kernels_dir)
    stats = compiled.passkit_reports[0].records[-1].stats
    if "bundle-true" in pipeline.name:  # the report row says what was built
        assert (stats["cpp_kernels"], stats["kernel_libraries"]) == (kernels, libraries)
    else:
        assert "kernel_libraries" not in stats
    return kernels, libraries


def _kernel_library_paths(kernels_dir: Path) -> list[Path]:
    """Libraries built from a kernel module's source (not the probes of the CPU's vector ISA,
    which a process builds once, in whichever cache folder it first compiles)."""
    sources = ((lib, lib.with_suffix(".cpp")) for lib in kernels_dir.rglob("*.so"))
    return [lib for lib, source in sources if source.exists() and "PyInit_kernel" in source.read_text()]


def _kernel_libraries(kernels_dir: Path) -> int:
    return len(_kernel_library_paths(kernels_dir))


def _conv_bn() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return ConvBN(), torch.randn(4, 3, 16, 16)


def test_each_graphs_kernels_build_as_a_few_libraries(tmp_path: Path) -> None:
    model, x = _conv_bn()
    bundled = _train_with_fresh_kernels(copy.deepcopy(model), x, _pipeline(tmp_path, True), tmp_path / "bundled")
    alone = _train_with_fresh_kernels(copy.deepcopy(model), x, _pipeline(tmp_path, False), tmp_path / "alone")
    kernels, libraries = bundled
    assert alone == (kernels, kernels)  # without bundles, a library per kernel
    assert kernels >= 4
    # At most one library per compile worker and graph, never more than one per kernel.
    assert libraries <= 2 * max(1, torch._inductor.config.compile_threads or 1)
    assert libraries < kernels


def test_a_bundle_that_fails_to_build_is_built_kernel_by_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from passkit._torch import kernel_bundles

    real_source: Callable[..., str] = kernel_bundles.bundle_source
    monkeypatch.setattr(kernel_bundles, "bundle_source", lambda kernels: real_source(kernels) + "\n#error planted\n")
    model, x = _conv_bn()
    kernels, libraries = _train_with_fresh_kernels(model, x, _pipeline(tmp_path, True), tmp_path / "kernels")
    assert libraries == kernels


def test_kernels_bundle_when_inductor_builds_without_worker_processes(tmp_path: Path) -> None:
    import torch._inductor.config as inductor_config

    model, x = _conv_bn()
    with inductor_config.patch(compile_threads=1):
        kernels, libraries = _train_with_fresh_kernels(model, x, _pipeline(tmp_path, True), tmp_path / "kernels")
    assert libraries == 2  # one per graph
    assert kernels > libraries


def test_kernels_with_symbolic_sizes_take_their_size_arguments_in_a_bundle(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    eager = copy.deepcopy(model)
    compiled = passkit.compile(model, pipeline=str(_pipeline(tmp_path, True)), cache="off", dynamic=True)
    (tmp_path / "kernels").mkdir()
    with fresh_cache(dir=str(tmp_path / "kernels"), delete=False):
        for rows in (5, 3, 11):  # one program, its sizes arguments of every kernel
            x = torch.randn(rows, 8)
            out, expected = compiled(x), eager(x)
            torch.testing.assert_close(out, expected, **TOLERANCE)
            out.sum().backward()
            expected.sum().backward()
            for p_compiled, p_eager in zip(model.parameters(), eager.parameters()):
                torch.testing.assert_close(p_compiled.grad, p_eager.grad, **TOLERANCE)
    (program,) = compiled.passkit_backend.programs
    source = program.compiled["forward"].passkit_source + program.compiled["backward"].passkit_source
    assert "'const int64_t'" in source  # kernels take a size
    kernels = len(re.findall(r"async_compile\.cpp_pybinding\(", source))
    assert _kernel_libraries(tmp_path / "kernels") < kernels


@pytest.mark.parametrize(
    ("source", "bundles"),
    [
        ('#include <torch/csrc/inductor/cpp_prefix.h>\nextern "C"  void  kernel(float* out_ptr0)\n{ out_ptr0[0] = 1; }\n', True),
        ('#include <a.h>\nextern "C" void kernel(float* p)\n{\n#define TWICE(x) (2 * (x))\n p[0] = TWICE(1); }\n', False),
        ('#include <a.h>\nstatic int k = 1;\n#include <b.h>\nextern "C" void kernel(float* p) { p[0] = k; }\n', False),
        ('#include <a.h>\nextern "C" void kernel(float* p) {}\nextern "C" void helper() {}\n', False),
        ('#include <a.h>\nextern "C" void entry(float* p) {}\n', False),
    ],
    ids=["inductor's shape", "a macro", "an include after code", "two C entries", "another entry name"],
)
def test_only_kernels_of_the_expected_shape_join_a_bundle(source: str, bundles: bool) -> None:
    assert _torch.can_bundle(source) is bundles


def test_two_threads_compiling_at_once_each_get_their_own_kernels() -> None:
    import threading

    from torch._inductor.async_compile import AsyncCompile

    inductors_own = (AsyncCompile.wait, AsyncCompile.cpp_pybinding)
    results: dict[int, Any] = {}

    def train(seed: int) -> None:
        try:
            torch.manual_seed(seed)
            width = 8 + 8 * seed  # other shapes, other kernels
            model = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.LayerNorm(16), torch.nn.Tanh())
            eager = copy.deepcopy(model)
            x = torch.randn(4, width)
            out = passkit.aot_module(model, pipeline="training")(x)
            torch.testing.assert_close(out, eager(x), **TOLERANCE)
            results[seed] = True
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            results[seed] = exc

    threads = [threading.Thread(target=train, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {1: True, 2: True}
    assert (AsyncCompile.wait, AsyncCompile.cpp_pybinding) == inductors_own


def test_a_second_process_finds_the_bundles_the_first_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile-cache hit compiles the stored graphs again; each graph bundles its kernels as
    the first process did, so Inductor's kernel cache has every library and g++ builds none."""
    import json
    import os
    import subprocess
    import sys

    from cache_child import compile_and_report

    kernels, entries = tmp_path / "kernels", tmp_path / "passkit"
    kernels.mkdir()
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(entries))
    monkeypatch.setenv("CHILD_PIPELINE", "training")
    with fresh_cache(dir=str(kernels), delete=False):
        cold = compile_and_report()
    (kernels,) = kernels.iterdir()  # the cache folder fresh_cache made there
    built = {lib: lib.stat().st_mtime_ns for lib in _kernel_library_paths(kernels)}
    assert built
    child = Path(__file__).parents[1] / "cache_child.py"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(kernels),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(child.parents[1]), os.environ.get("PYTHONPATH", "")]))}
    done = subprocess.run([sys.executable, str(child)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    warm = json.loads(done.stdout.strip().splitlines()[-1])
    assert (cold["cache"], warm["cache"]) == ("miss", "hit")
    assert {lib: lib.stat().st_mtime_ns for lib in _kernel_library_paths(kernels)} == built
    assert (warm["out"], warm["grads"]) == (cold["out"], cold["grads"])
