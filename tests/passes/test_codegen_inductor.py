"""``codegen.inductor`` trains and infers like eager, validates its options, and fails in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import passkit
from passkit.examples.convnet import ConvBN
from passkit.examples.transformer import MLP, Block

from tiny_programs import assert_seeded_steps_match_eager

pytestmark = pytest.mark.slow  # every test here pays for Inductor compiling C++ kernels

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # fused kernels sum in another order than ATen


MODELS = {
    "block": (lambda: Block(32, 4), lambda: torch.randn(2, 8, 32)),
    "mlp": (lambda: MLP(16, 32), lambda: torch.randn(4, 16)),
    "conv_bn": (ConvBN, lambda: torch.randn(2, 3, 8, 8)),
}


def _models(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    make_model, make_input = MODELS[name]
    torch.manual_seed(0)
    eager = make_model()
    return eager, copy.deepcopy(eager), make_input()


@pytest.mark.parametrize("name", list(MODELS))
def test_training_steps_match_eager(name: str) -> None:
    torch._dynamo.reset()
    eager, twin, x = _models(name)
    compiled = passkit.compile(twin, pipeline="training")
    for step in range(2):
        for model in (eager, twin):
            model.zero_grad(set_to_none=True)
        expected, actual = eager(x), compiled(x)
        torch.testing.assert_close(actual, expected, **TOLERANCE, msg=lambda m: f"step {step} output: {m}")
        (expected**2).mean().backward()
        (actual**2).mean().backward()
        for (pname, p_eager), p_twin in zip(eager.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p_twin.grad, p_eager.grad, **TOLERANCE, msg=lambda m: f"step {step} grad {pname}: {m}")
    for (bname, b_eager), b_twin in zip(eager.named_buffers(), twin.buffers()):
        torch.testing.assert_close(b_twin, b_eager, **TOLERANCE, msg=lambda m: f"buffer {bname}: {m}")
    (report,) = compiled.passkit_reports
    assert report.records[-1].pass_name == "codegen.inductor"
    # Inductor stores BatchNorm's new running statistics into the buffers itself (in the kernel
    # that computes them), as in torch.compile; the runtime copies nothing back.
    expected_written = 3 if name == "conv_bn" else None  # running mean, variance, count
    assert report.records[-1].stats.get("mutations_written_in_graph") == expected_written


# Inductor lowers dropout's `bernoulli.p` to a copy filled in place, and fused the layer norm's
# kernel with the readers of that copy before the fill ran: the output was norm x uninitialized
# memory (a NaN loss on BERT). Seeded alike, both draw ATen's masks (`fallback_random`).
def test_dropout_after_a_layer_norm_draws_eagers_mask() -> None:
    def model() -> nn.Module:
        return nn.Sequential(nn.LayerNorm(32), nn.Dropout(0.1), nn.Linear(32, 8))

    assert_seeded_steps_match_eager(model, torch.randn(4, 12, 32), "training")


def _two_dropouts_read_in_the_other_order(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    first = nn.functional.dropout(x, 0.5, training=True)
    second = nn.functional.dropout(y, 0.5, training=True)
    return ((second @ w).relu() @ w).sin(), first.cos()


# Each dropout draws from ATen's one generator, so their order decides which mask each gets.
# torch 2.11's Inductor moved the first past the second (for locality here, for peak memory in
# GPT-2): every value was off by up to 2, and GPT-2's loss by 3e-3.
def test_two_dropouts_draw_in_the_graphs_order_whatever_inductor_would_reorder(monkeypatch) -> None:
    from torch._inductor import compile_fx
    from torch._inductor import config as inductor_config

    reorderings: list[tuple[bool, bool]] = []
    real = compile_fx.compile_fx_inner

    def recording(gm, example_inputs, **kwargs):
        reorderings.append((inductor_config.reorder_for_locality, inductor_config.reorder_for_peak_memory))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording)
    x, y, w = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64)
    torch.manual_seed(0)
    expected = _two_dropouts_read_in_the_other_order(x, y, w)
    compiled = passkit.aot_function(_two_dropouts_read_in_the_other_order, pipeline="training", cache="off")
    torch.manual_seed(0)
    actual = compiled(x, y, w)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert reorderings == [(False, False)]


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_eager(name: str) -> None:
    torch._dynamo.reset()
    eager, twin, x = _models(name)
    eager.eval()
    twin.eval()
    compiled = passkit.compile(twin, pipeline="inference")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x), **TOLERANCE)
    (report,) = compiled.passkit_reports
    assert [r.pass_name for r in report.records][-1] == "codegen.inductor"
    assert "backward" not in compiled.passkit_backend.programs[0].compiled


def test_gradients_in_another_layout_than_traced_are_accepted() -> None:
    # ``sum().backward()`` hands the backward an expanded (stride 0) gradient; Inductor's code
    # asserts the traced strides, so the wrapper must copy it first.
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    compiled = passkit.aot_function(lambda a, b: (a @ b).tanh(), pipeline="training")
    compiled(x, w).sum().backward()
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x_ref @ w_ref).tanh().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOLERANCE)
    torch.testing.assert_close(w.grad, w_ref.grad, **TOLERANCE)


def test_a_symbolic_program_accepts_gradients_in_another_layout() -> None:
    # Under ``dynamic=True`` the traced strides are expressions of the sizes; the wrapper lays the
    # expanded gradient out densely in the traced order for each call's sizes.
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline="training", cache="off", dynamic=True)
    for shape in ((2, 5, 8), (3, 7, 8)):
        x = torch.randn(*shape)
        compiled(x).sum().backward()
        eager(x).sum().backward()
        for param, expected in zip(twin.parameters(), eager.parameters()):
            torch.testing.assert_close(param.grad, expected.grad, **TOLERANCE)


def test_input_mutations_and_views_are_written_back() -> None:
    def fn(x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state.mul_(0.5).add_(x.detach().mean())
        y = (x * state).sin()
        return y, y.view(-1)

    x, state = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    x_ref, state_ref = x.detach().clone().requires_grad_(), state.clone()
    out, flat = passkit.aot_function(fn, pipeline="training")(x, state)
    out_ref, flat_ref = fn(x_ref, state_ref)
    torch.testing.assert_close(state, state_ref, **TOLERANCE)
    torch.testing.assert_close(flat, flat_ref, **TOLERANCE)
    assert flat._base is out or flat._base is out._base
    (out * 2).sum().backward()
    (out_ref * 2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOLERANCE)


def test_a_missing_cxx_compiler_names_the_fallback_pipeline(tmp_path, monkeypatch) -> None:
    import torch._inductor.config as inductor_config

    # A fresh kernel cache, so the missing compiler is really needed.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    compiled = passkit.aot_function(lambda x: (x * 3).cos() + 1.25, pipeline="training", repro_dir=str(tmp_path / "repro"))
    no_compiler = {"fx_graph_cache": False, "cpp.cxx": (None, str(tmp_path / "no-such-c++"))}
    with inductor_config.patch(no_compiler), pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(5, 7, requires_grad=True))
    message = str(info.value)
    assert "\n" not in message
    assert "InvalidCxxCompiler: No working C++ compiler found" in message
    training = passkit.load_pipeline("training")
    codegen = training.step("codegen.inductor")
    ran_before = ", ".join(s.id for s in training.steps[: codegen.position] if s.enabled)
    assert message.startswith(
        f"{training.where(codegen)} failed: PassError: Inductor cannot compile the 'forward' graph ("
    )
    assert message.endswith(
        "; use the 'training-python' pipeline, which needs no C++ compiler "
        f"(after: {ran_before}) (reproducer: {tmp_path / 'repro'}/{codegen.position + 1:02d}-codegen.inductor)"
    )


def test_a_kernel_that_fails_to_build_after_both_graphs_are_lowered_is_one_line(tmp_path, monkeypatch) -> None:
    """Kernels build while the backward lowers and are waited for once both graphs are lowered;
    a build failing there is the same one-line error naming the fallback pipeline."""
    from torch._inductor.async_compile import AsyncCompile

    def fails(self, scope):
        raise RuntimeError("C++ compile error\n/tmp/kernel.cpp:3: error: ...")

    monkeypatch.setattr(AsyncCompile, "wait", fails)
    compiled = passkit.aot_function(lambda x: (x * 3).cos() + 1.25, pipeline="training", repro_dir=str(tmp_path / "repro"))
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(5, 7, requires_grad=True))
    message = str(info.value)
    assert "\n" not in message
    assert "PassError: Inductor cannot compile the 'forward or backward' graph (RuntimeError: C++ compile error); " \
        "use the 'training-python' pipeline, which needs no C++ compiler (after: " in message


def test_options_are_validated(tmp_path) -> None:
    path = tmp_path / "fast.toml"
    path.write_text('[pipeline]\nname = "fast"\nextends = "training"\n\n[override."codegen.inductor"]\nmode = "fast"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(str(path))
    assert str(info.value) == (
        f"{path}: override.\"codegen.inductor\".mode: Input should be 'default', 'reduce-overhead', 'max-autotune' "
        "or 'max-autotune-no-cudagraphs'"
    )


def test_the_inductor_table_is_inductors_whole_table_and_ops_it_may_leave_stay_decomposed() -> None:
    from passkit import _torch
    from passkit.passes.core_facts import _in_opset
    from passkit.core.program import TargetOpset

    aten = torch.ops.aten
    table = _torch.inductor_decompositions()
    # torch's AOT applies every one of these before Inductor lowers, declining ones included.
    assert aten.max_pool2d_with_indices_backward.default in table and aten.mm.default in table
    for op in (aten.mm.default, aten.amax.default, aten.full.default, aten.max_pool2d_with_indices_backward.default):
        assert _torch.decomposition_may_decline(table[op])
    assert not _torch.decomposition_may_decline(table[aten.hardswish.default])
    target = TargetOpset(("inductor",), (), (), table=table, kept=frozenset())
    assert _in_opset(target, aten.mm.default, before_joint=False)  # declined: Inductor lowers it
    assert not _in_opset(target, aten.hardswish.default, before_joint=False)


# Inductor lowers a max-pool backward it is handed as a loop over every window covering each
# input; the table's decomposition scatters each gradient once, as torch.compile does (ResNet's
# backward spent 0.3 ms of its 1.2 ms in that loop).
def test_a_max_pool_backward_becomes_a_scatter_as_in_torch_compile() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.Flatten(), nn.Linear(64, 2))
    twin = copy.deepcopy(eager)
    x = torch.randn(2, 3, 8, 8)
    compiled = passkit.compile(twin, pipeline="training")
    _step(eager, x)
    _step(compiled, x)
    _assert_same_grads(twin, eager)
    (program,) = compiled.passkit_backend.programs
    targets = {str(n.target) for n in program.graphs["backward"].graph.nodes}
    assert "aten.max_pool2d_with_indices_backward.default" not in targets
    assert "aten.scatter_add.default" in targets or "aten.index_put.default" in targets, sorted(targets)


def _backward_source(compiled: nn.Module) -> str:
    from passkit.instruments.dumps import generated_code

    (program,) = compiled.passkit_backend.programs
    source = generated_code(program.compiled["backward"])
    assert source is not None
    return source


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_algorithms_make_an_embeddings_backward_add_in_one_order(deterministic: bool) -> None:
    """As under torch.compile: Inductor's scatter-add adds from several threads with atomic adds
    (the last bits of the gradient vary run to run) unless deterministic algorithms are on."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = nn.Embedding(64, 16)
    twin = copy.deepcopy(eager)
    ids = torch.randint(0, 64, (64, 512))
    torch.use_deterministic_algorithms(deterministic)
    try:
        compiled = passkit.compile(twin, pipeline="training")
        _step(eager, ids)
        _step(compiled, ids)
    finally:
        torch.use_deterministic_algorithms(False)
    _assert_same_grads(twin, eager)
    assert ("atomic_add" in _backward_source(compiled)) is not deterministic


def _step(model: nn.Module, x: torch.Tensor, *, retain: bool = False) -> torch.Tensor:
    out = model(x)
    loss = out[0] if isinstance(out, tuple) else out
    loss = loss.square().mean()
    loss.backward(retain_graph=retain)
    if retain:
        loss.backward()  # the graph is kept: a second backward reads the same saved tensors
    return out


def _assert_same_grads(twin: nn.Module, eager: nn.Module) -> None:
    for (pname, p_eager), p_twin in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad, **TOLERANCE, msg=lambda m: f"grad {pname}: {m}")


def _two_stages() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """Two conv-BN-ReLU stages: the backward's gradient for the first ReLU's output can take
    that output's memory, which only the backward reads."""
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 4),
    )
    return eager, copy.deepcopy(eager), torch.randn(2, 3, 6, 6)


# torch's AOT tells Inductor which saved activations are dead once the backward reads them, and
# Inductor writes its own buffers into them instead of allocating; passkit does the same.
def test_the_backward_writes_into_saved_activations_nothing_else_reads() -> None:
    torch._dynamo.reset()
    eager, twin, x = _two_stages()
    compiled = passkit.compile(twin, pipeline="training")
    for _ in range(2):
        _step(eager, x)
        _step(compiled, x)
    _assert_same_grads(twin, eager)
    (report,) = compiled.passkit_reports
    assert report.records[-1].stats["donated_saved"] >= 1
    assert "_donated; del " in _backward_source(compiled)  # ``bufN = relu_donated; del relu_donated  # reuse``


def test_a_backward_that_keeps_its_graph_reads_the_saved_activations_it_overwrote_unchanged() -> None:
    torch._dynamo.reset()
    eager, twin, x = _two_stages()
    compiled = passkit.compile(twin, pipeline="training")
    _step(eager, x, retain=True)
    _step(compiled, x, retain=True)
    _assert_same_grads(twin, eager)
    assert "_donated; del " in _backward_source(compiled)


class _ReturnsActivation(nn.Module):
    """Returns the second ReLU's output, which its backward also saves (and, were it donated,
    would write the gradient of that same output into)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        activation = self.second(self.first(x).relu()).relu()
        return self.head(activation), activation


def test_a_saved_activation_the_caller_holds_is_not_overwritten() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = _ReturnsActivation()
    twin = copy.deepcopy(eager)
    x = torch.randn(4, 8)
    compiled = passkit.compile(twin, pipeline="training")
    _, expected = _step(eager, x)
    _, actual = _step(compiled, x)
    torch.testing.assert_close(actual, expected, **TOLERANCE)
    _assert_same_grads(twin, eager)
    assert "_donated; del " in _backward_source(compiled)  # the first ReLU's output is reused


def test_inductors_cache_never_serves_donating_code_to_a_backward_without_donation(tmp_path, monkeypatch) -> None:
    # Inductor's FX graph cache keys on the graph's code, not on the donation; a backward
    # compiled without donation that got the donating code would overwrite the saved
    # activations that a second backward (``retain_graph``) reads, uncopied.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # only this test's entries
    path = tmp_path / "keep.toml"
    path.write_text('[pipeline]\nname = "keep"\nextends = "training"\n\n[override."codegen.inductor"]\ndonate_saved = false\n')
    for pipeline in ("training", str(path)):  # the same backward graph, Inductor's FX cache on
        torch._dynamo.reset()
        eager, twin, x = _two_stages()
        compiled = passkit.compile(twin, pipeline=pipeline)
        _step(eager, x, retain=True)
        _step(compiled, x, retain=True)
        _assert_same_grads(twin, eager)


def test_a_long_codegen_beats_with_the_kernels_generated_so_far(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import re

    from passkit.core import progress
    monkeypatch.setattr(progress, "STARTED_AFTER_S", 0.01)
    monkeypatch.setattr(progress, "HEARTBEAT_EVERY_S", 0.02)
    torch._dynamo.reset()
    eager, twin, x = _models("mlp")
    compiled = passkit.compile(twin, pipeline="training", cache="off")
    # Inductor's config through its own patch: pytest's monkeypatch deletes a module attribute it
    # did not find in the module's __dict__ (pytest 9.2), which hides the setting from later tests.
    with torch._inductor.config.patch(fx_graph_cache=False), caplog.at_level(logging.INFO, logger="passkit"):
        compiled(x)  # generates kernels rather than loading them
    lines = [r.getMessage() for r in caplog.records if "codegen.inductor" in r.getMessage()]
    total = len(passkit.load_pipeline("training").steps)
    assert re.fullmatch(rf"\[{total}/{total}\] codegen\.inductor: started, running for \d+\.\d s", lines[0]), lines
    beats = [re.fullmatch(rf"\[{total}/{total}\] codegen\.inductor: still running, \d+\.\d s, (\d+) kernels generated so far", line)
             for line in lines[1:-1]]
    assert beats and all(beats), lines
    assert int(beats[-1].group(1)) > 0, lines  # type: ignore[union-attr]
    assert re.fullmatch(rf"\[{total}/{total}\] codegen\.inductor: unchanged, .*", lines[-1]), lines


PROBES_CHILD = """
import threading
import passkit
from torch._inductor import cpu_vec_isa

passkit.backend("training")  # builds the backend: codegen.inductor's prepare runs, no graph compiles
probes = [t for t in threading.enumerate() if t.name == "passkit-inductor-cpu-probes"]
for probe in probes:
    probe.join(300)
print(len(probes), cpu_vec_isa.valid_vec_isa_list.cache_info().currsize)  # probed, or this machine's answer adopted
"""


PROBES_LEAVE_META_PATH_CHILD = """
import sys
import threading

import torch


class Watched(list):
    \"\"\"sys.meta_path, noting every change made on a thread other than the main one.\"\"\"

    changed_elsewhere = []

    def insert(self, *args):
        self._note("insert")
        super().insert(*args)

    def remove(self, *args):
        self._note("remove")
        super().remove(*args)

    def _note(self, what):
        if threading.current_thread() is not threading.main_thread():
            self.changed_elsewhere.append((what, threading.current_thread().name))


sys.meta_path = Watched(sys.meta_path)
from passkit._torch import cpu_probes

cpu_probes.start_cpu_probes()
probes = [t for t in threading.enumerate() if t.name == "passkit-inductor-cpu-probes"]
for probe in probes:
    probe.join(300)
print(len(probes), Watched.changed_elsewhere)
"""


def _cold_inductor_folder(tmp_path) -> dict[str, str]:
    """A child's environment with an Inductor cache folder of its own: no recorded probe answer
    (``passkit._torch.cpu_probes``), so the probe thread runs."""
    import os

    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA present the first kernels are Triton's: no CPU probes")
def test_the_probe_thread_leaves_the_import_system_alone_while_dynamo_imports(tmp_path) -> None:
    # setuptools' distutils shim, imported with the probes, takes a finder in and out of
    # sys.meta_path: on the probe thread that made Dynamo's own imports fail now and then.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBES_LEAVE_META_PATH_CHILD], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env=_cold_inductor_folder(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "1 []"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA present the first kernels are Triton's: no CPU probes")
def test_building_the_backend_runs_inductors_cpu_probes_on_a_thread_before_any_graph(tmp_path) -> None:
    # Inductor probes the CPU's vector instructions (a compiler run and a fresh Python process per
    # instruction set) before its first C++ kernel; started when the backend is built, they run
    # while Dynamo traces instead of inside the first compile or cache load.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBES_CHILD], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=_cold_inductor_folder(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1"]  # one probe thread, and the probes' result is cached


class _Noise(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x * torch.rand_like(x), x + torch.randn(x.shape)


def _drawing_its_own_way() -> dict:
    return {"pipeline": {"name": "own-random"},
            "steps": [{"pass": "functionalize"}, {"pass": "decompose", "tables": ["inductor"]},
                      {"pass": "joint.inductor_passes"}, {"pass": "codegen.inductor", "fallback_random": False}]}


# passkit's joint passes leave random ops whole, so `rand` and `randn` reached Inductor as ATen
# ops, which it lowers only under `fallback_random` ("should have been handled in
# replace_random.py"): every graph drawing them failed to compile, the `inference` pipeline's
# included. Drawing its own way, Inductor draws what torch.compile's draws.
def test_random_ops_drawn_inductors_own_way_equal_torch_compiles() -> None:
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    torch.manual_seed(3)
    expected = torch.compile(_Noise(), backend="inductor", options={"fallback_random": False})(x)
    torch._dynamo.reset()
    torch.manual_seed(3)
    got = passkit.compile(_Noise(), pipeline=_drawing_its_own_way(), cache="off")(x)
    torch.manual_seed(3)
    eager = _Noise()(x)
    for mine, theirs, eagers in zip(got, expected, eager):
        assert torch.equal(mine, theirs)
        assert not torch.equal(mine, eagers)  # its own generator: not eager's numbers


def test_the_inference_pipeline_draws_eagers_random_numbers() -> None:
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    torch.manual_seed(3)
    got = passkit.compile(_Noise(), pipeline="inference", cache="off")(x)
    torch.manual_seed(3)
    for mine, eagers in zip(got, _Noise()(x)):
        assert torch.equal(mine, eagers)
