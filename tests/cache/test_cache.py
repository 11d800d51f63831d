"""The on-disk compile cache: hits across processes, concurrent writers, killed writers, corrupt
entries, what the key covers, and ``passkit cache``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cache.store import CACHE_ENV, cache_info, write_atomically
from passkit.cli import main

from cache_child import compile_and_report

CHILD = Path(__file__).resolve().parents[1] / "cache_child.py"
ROOT = Path(__file__).resolve().parents[2]


def _child_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, CACHE_ENV: str(cache), **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _run_child(cache: Path, *args: str, pipeline: str = "training-python") -> dict:
    done = subprocess.run([sys.executable, str(CHILD), *args], env=_child_env(cache, CHILD_PIPELINE=pipeline),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.entry"))


def test_a_second_process_loads_the_compiled_program_and_computes_the_same(tmp_path: Path) -> None:
    cold = _run_child(tmp_path)
    warm = _run_child(tmp_path)
    assert (cold["cache"], warm["cache"]) == ("miss", "hit")
    steps = len(passkit.load_pipeline("training-python").steps)
    assert cold["passes_run"] == steps and warm["passes_run"] == 0  # the hit ran no pass at all
    assert (warm["out"], warm["grads"]) == (cold["out"], cold["grads"])
    assert len(_entries(tmp_path)) == 1


def test_a_process_running_edited_passkit_sources_compiles_again(tmp_path: Path) -> None:
    """The key covers passkit's own files: a local edit of its runtime (or an upgrade) never
    loads what other passkit code compiled, and unchanged sources still hit."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "passkit", site / "passkit", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"

    def run() -> dict:
        env = _child_env(cache, CHILD_PIPELINE="training-python")
        env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
        done = subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = run(), run()
    assert cold["passkit"] == str(site / "passkit" / "__init__.py")
    assert (cold["cache"], warm["cache"]) == ("miss", "hit")
    runtime = site / "passkit" / "runtime" / "wrapper.py"
    runtime.write_text(runtime.read_text() + "\n# a local edit\n")
    edited = run()
    steps = len(passkit.load_pipeline("training-python").steps)
    assert (edited["cache"], edited["passes_run"]) == ("miss", steps)
    assert (edited["out"], edited["grads"]) == (cold["out"], cold["grads"])
    assert len(_entries(cache)) == 2


def test_the_key_follows_passkit_source_digest(monkeypatch) -> None:
    from passkit.cache import key as cache_key_module
    from tiny_programs import make_program

    pipeline, program = passkit.load_pipeline("training-python"), make_program()
    key = cache_key_module.cache_key(pipeline, program)
    assert cache_key_module.cache_key(pipeline, program) == key
    monkeypatch.setattr(cache_key_module, "passkit_source_digest", lambda: "0" * 64)
    assert cache_key_module.cache_key(pipeline, program) != key


@pytest.mark.slow
def test_a_second_process_loads_inductor_code_without_running_any_stage_or_inductor_codegen(tmp_path: Path,
                                                                                           monkeypatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CHILD_PIPELINE", "training")
    cold = compile_and_report()  # in this process: one interpreter start less
    warm = _run_child(tmp_path, pipeline="training")
    assert (cold["cache"], warm["cache"]) == ("miss", "hit")
    steps = len(passkit.load_pipeline("training").steps)
    assert cold["passes_run"] == steps and warm["passes_run"] == 0
    # Inductor's inner compile ran for the forward and the backward, and found both in its own
    # FX graph cache (the cold process compiled with the same graphs and inputs): no codegen.
    assert warm["inductor"] == {"hit": 2, "miss": 0, "bypass": 0}
    # ...under the keys the cold process filed them under: the warm one hashed no graph for them.
    assert (cold["graphs_hashed"], warm["graphs_hashed"]) == (2, 0)
    assert (warm["out"], warm["grads"]) == (cold["out"], cold["grads"])
    torch.testing.assert_close(
        [torch.tensor(warm["out"]), *map(torch.tensor, warm["grads"])],
        [torch.tensor(warm["eager_out"]), *map(torch.tensor, warm["eager_grads"])],
        rtol=1e-4, atol=1e-5,
    )
    assert len(_entries(tmp_path)) == 1


@pytest.mark.slow
def test_concurrent_processes_compiling_one_model_all_succeed(tmp_path: Path, monkeypatch) -> None:
    children = [
        subprocess.Popen([sys.executable, str(CHILD)], env=_child_env(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({json.dumps([r["out"], r["grads"]]) for r in results}) == 1
    assert len(_entries(tmp_path)) == 1 and cache_info(tmp_path).incomplete == 0
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert compile_and_report()["cache"] == "hit"  # what the racing writers left is a valid entry


def test_threads_compiling_one_function_share_the_cache_and_agree() -> None:
    results: dict[int, tuple] = {}
    errors: list[str] = []

    def work(index: int) -> None:
        try:
            seeded = torch.Generator().manual_seed(0)  # torch's global RNG is shared by the threads
            x, w = torch.randn(4, 3, generator=seeded), torch.randn(3, 5, generator=seeded).requires_grad_()
            compiled = passkit.aot_function(fn, pipeline="training-python")
            out = compiled(x, w)
            out.sum().backward()
            results[index] = (compiled.passkit_reports[0].cache, out.detach(), w.grad)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(cache for cache, _, _ in results.values()) == ["", "hit", "hit"]  # tracing takes turns
    first = results[0]
    for _, out, grad in results.values():
        torch.testing.assert_close((out, grad), first[1:], rtol=0, atol=0)
    assert len(_entries(Path(os.environ[CACHE_ENV]))) == 1


def test_concurrent_threads_writing_one_entry_leave_one_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "k.entry"
    payloads = [bytes([i]) * 2_000_000 for i in range(8)]
    threads = [threading.Thread(target=write_atomically, args=(target, p)) for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert target.read_bytes() in payloads
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.entry"]


def test_a_writer_killed_mid_write_leaves_no_entry_and_the_next_compile_works(tmp_path: Path, monkeypatch) -> None:
    child = subprocess.Popen([sys.executable, str(CHILD), "--hang-in-write"], env=_child_env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert _entries(tmp_path) == []
    assert cache_info(tmp_path).incomplete == 1  # the temporary file, never renamed into place
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cold = compile_and_report()
    assert cold["cache"] == "miss" and cold["passes_run"] > 0 and len(_entries(tmp_path)) == 1
    assert compile_and_report()["cache"] == "hit"


def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).sum(-1)


def _compile_and_run(pipeline: str = "training-python", **settings: object) -> tuple[object, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    compiled = passkit.aot_function(fn, pipeline=pipeline, **settings)
    out = compiled(x, w)
    out.sum().backward()
    return compiled, out.detach(), w.grad


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda data: data[: len(data) // 2], "truncated ("),
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum mismatch"),
        (lambda data: b"", "not a passkit cache entry"),
    ],
)
def test_a_damaged_entry_is_deleted_with_one_warning_and_recompiled(damage, why, caplog) -> None:
    first, out, grad = _compile_and_run()
    (entry,) = _entries(Path(os.environ[CACHE_ENV]))
    entry.write_bytes(damage(entry.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        second, out2, grad2 = _compile_and_run()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"passkit: cache entry {entry.name} is corrupt ({why}")
    assert warnings[0].endswith("); deleted it, compiling again")
    assert second.passkit_reports[0].cache == "miss"
    torch.testing.assert_close((out2, grad2), (out, grad), rtol=0, atol=0)
    assert _compile_and_run()[0].passkit_reports[0].cache == "hit"  # rewritten whole


@pytest.mark.slow
def test_an_inductor_entry_that_fails_to_load_is_deleted_with_one_warning_and_recompiled(monkeypatch, caplog) -> None:
    from passkit.passes import codegen_inductor_cache

    first, out, grad = _compile_and_run("training")
    (entry,) = _entries(Path(os.environ[CACHE_ENV]))
    monkeypatch.setattr(codegen_inductor_cache, "FORMAT", codegen_inductor_cache.FORMAT + 1)  # as if passkit changed what it stores
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        second, out2, grad2 = _compile_and_run("training")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"passkit: cache entry {entry.name} is corrupt (written by another version of "
                        "codegen.inductor); deleted it, compiling again"]
    assert (first.passkit_reports[0].cache, second.passkit_reports[0].cache) == ("", "")
    torch.testing.assert_close((out2, grad2), (out, grad), rtol=0, atol=0)


def test_the_key_follows_inductor_config_and_codegen_inductor_options() -> None:
    from torch._inductor import config as inductor_config

    from passkit.cache.store import cache_key
    from tiny_programs import make_program

    pipeline = passkit.load_pipeline("training")
    (step,) = [s for s in pipeline.steps if s.pass_name == "codegen.inductor"]
    context, program = step.pass_.cache_context, make_program()
    key = cache_key(pipeline, program)
    assert cache_key(pipeline, program) == key
    with inductor_config.patch({"cpp.simdlen": 8}):  # a user's global Inductor setting
        assert cache_key(pipeline, program) != key
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # C++ kernels split their loops for the thread count
    try:
        assert cache_key(pipeline, program) != key
    finally:
        torch.set_num_threads(threads)
    assert cache_key(pipeline, program) == key
    assert context(step.options.model_copy(update={"size_asserts": False})) != context(step.options)


SWITCHES = {
    "deterministic": (lambda: torch.use_deterministic_algorithms(True), lambda: torch.use_deterministic_algorithms(False)),
    "matmul_precision": (lambda: torch.set_float32_matmul_precision("medium"),
                         lambda: torch.set_float32_matmul_precision("highest")),
}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_a_program_compiled_before_a_global_switch_is_not_loaded_after_it(switch: str) -> None:
    """Inductor emits atomic adds for an embedding's backward unless deterministic algorithms are
    on; an entry holds that code, so the switch is part of the key, as in Inductor's own cache."""
    turn_on, turn_off = SWITCHES[switch]
    before, out, grad = _compile_and_run()
    turn_on()
    try:
        after, out2, grad2 = _compile_and_run()
        again, _, _ = _compile_and_run()
    finally:
        turn_off()
    back, _, _ = _compile_and_run()
    assert [c.passkit_reports[0].cache for c in (before, after, again, back)] == ["", "", "hit", "hit"]
    torch.testing.assert_close((out2, grad2), (out, grad), rtol=0, atol=0)


def _mm_relu_and_ones(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x @ w).relu(), torch.ones(w.shape[-1]) * w.sum()


@contextlib.contextmanager
def _default_float64():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize(("ambient", "dtypes"), [
    (lambda: torch.autocast("cpu", dtype=torch.bfloat16), (torch.bfloat16, torch.float32)),
    (_default_float64, (torch.float32, torch.float64)),
], ids=["autocast", "default_dtype"])
def test_a_program_compiled_outside_an_ambient_setting_is_not_loaded_inside_it(ambient, dtypes) -> None:
    """Autocast entered outside the compiled code, and the default dtype of a factory, are traced
    into the graph, and Dynamo's graph does not show them: loading the entry compiled without
    autocast gave float32 where eager gives bfloat16."""
    x = torch.randn(8, 8, dtype=torch.float32)
    w = torch.randn(8, 8, dtype=torch.float32, requires_grad=True)
    plain = passkit.compile(_mm_relu_and_ones, pipeline="training")
    assert [o.dtype for o in plain(x, w)] == [torch.float32, torch.float32]
    torch._dynamo.reset()
    inside = passkit.compile(_mm_relu_and_ones, pipeline="training")
    with ambient():
        out, expected = inside(x, w), _mm_relu_and_ones(x, w)
    assert [o.dtype for o in out] == [o.dtype for o in expected] == list(dtypes)
    # ``w.sum()`` is a float32 sum in both; Inductor adds in another order than ATen.
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert [r.cache for r in (*plain.passkit_reports, *inside.passkit_reports)] == ["miss", "miss"]


def test_an_in_process_hit_matches_exactly_and_is_marked_in_the_report() -> None:
    first, out, grad = _compile_and_run()
    second, out2, grad2 = _compile_and_run()
    assert (first.passkit_reports[0].cache, second.passkit_reports[0].cache) == ("miss", "hit")
    torch.testing.assert_close((out2, grad2), (out, grad), rtol=0, atol=0)
    table = second.passkit_reports[0].table()
    assert table.splitlines()[0] == "pipeline training-python (graph 1, training, cache hit: no step ran)"
    compiled_in = first.passkit_reports[0].table().splitlines()[-1].split(", ")[-1].removesuffix(" in total")
    steps = len(first.passkit_reports[0].records)
    load = second.passkit_reports[0].load_seconds
    assert 0 < load < 60
    assert table.splitlines()[-1] == (f"loaded from the compile cache in {load * 1000:.1f} ms, no step ran (the process "
                                      f"that compiled it ran {steps} of {steps} steps in {compiled_in})")


def test_a_hit_logs_one_line_with_its_load_time_not_the_compiling_runs_steps(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="passkit"):
        first, _, _ = _compile_and_run()
        caplog.clear()
        second, _, _ = _compile_and_run()
    lines = [r.getMessage() for r in caplog.records if r.name == "passkit"]
    steps = len(first.passkit_reports[0].records)
    load = second.passkit_reports[0].load_seconds
    compiled_in = f"{first.passkit_reports[0].seconds * 1000:.1f} ms"
    assert lines == [f"loaded from the compile cache in {load * 1000:.1f} ms, no step ran (the process "
                     f"that compiled it ran {steps} of {steps} steps in {compiled_in})"]


@pytest.mark.slow
def test_a_loaded_backward_still_copies_the_activations_it_overwrites_when_the_graph_is_kept() -> None:
    # The stored graph names its donated inputs, so the reloaded code overwrites them; the
    # runtime must still know which to copy before a backward that keeps its graph.
    def step() -> tuple[object, list[torch.Tensor]]:
        torch._dynamo.reset()  # static shapes, whatever Sequential another test compiled
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4))
        compiled = passkit.compile(model, pipeline="training")
        loss = compiled(torch.randn(4, 8)).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
        return compiled, [p.grad for p in model.parameters()]

    first, grads = step()
    second, reloaded = step()
    assert (first.passkit_reports[0].cache, second.passkit_reports[0].cache) == ("miss", "hit")
    assert first.passkit_reports[0].records[-1].stats["donated_saved"] >= 1
    torch.testing.assert_close(reloaded, grads, rtol=0, atol=0)


def test_cache_off_writes_nothing_and_watching_settings_never_read() -> None:
    _compile_and_run(cache="off")
    assert _entries(Path(os.environ[CACHE_ENV])) == []
    _compile_and_run()
    # verify and dump watch the steps run, so they bypass what is stored.
    assert _compile_and_run(verify="facts")[0].passkit_reports[0].cache == ""


def test_an_option_change_or_a_plugin_edit_changes_the_key(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "acme_cache_plugin.py"
    source.write_text(
        "import passkit\n\n@passkit.graph_pass('acme.noop')\ndef noop(program) -> bool:\n    return False\n"
    )
    import acme_cache_plugin

    try:
        before = acme_cache_plugin.noop.fingerprint()
        source.write_text(source.read_text() + "\n# a helper changed below\n")
        assert acme_cache_plugin.noop.fingerprint() != before
    finally:
        sys.modules.pop("acme_cache_plugin", None)
    pipeline = passkit.load_pipeline("training-python")
    fast = pipeline.fingerprint()
    (tmp_path / "slow.toml").write_text(
        "[pipeline]\nextends = 'training-python'\n[override.'codegen.python']\nfast_calls = false\n"
    )
    assert passkit.load_pipeline(str(tmp_path / "slow.toml")).fingerprint() != fast


def test_cache_info_and_clear(tmp_path: Path) -> None:
    _compile_and_run()
    folder = os.environ[CACHE_ENV]
    (Path(folder) / ".abc.tmp").write_bytes(b"half")
    runner = CliRunner()
    info = runner.invoke(main, ["cache", "info", "--json"])
    assert info.exit_code == 0
    data = json.loads(info.stdout)
    assert (data["directory"], data["entries"], data["incomplete"]) == (folder, 1, 1) and data["bytes"] > 0
    text = runner.invoke(main, ["cache", "info"]).stdout.splitlines()
    assert text[0] == f"directory: {folder}" and text[1].startswith("entries: 1 (")
    cleared = runner.invoke(main, ["cache", "clear"])
    assert cleared.stdout == f"removed 2 files from {folder}\n"
    assert cache_info(Path(folder)).entries == 0


def test_compiled_code_that_calls_a_closure_is_not_stored(register_passkit_plugin) -> None:
    """A graph module calling a function that pickling cannot find again by name (a kernel
    closure, say) compiles every time rather than reloading something else."""
    from torch.fx import symbolic_trace

    from passkit.core.hookspecs import hookimpl
    from passkit.core.pass_api import graph_pass

    def make_kernel():
        def kernel(x):
            return x.sin() * 2

        return kernel

    @graph_pass("test.codegen_closure", produces={"compiled"})
    def codegen_closure(program) -> bool:
        """Compile every graph to a module that calls a closure."""
        for name in program.graphs:
            gm = symbolic_trace(lambda x: x)
            node = next(n for n in gm.graph.nodes if n.op == "output")
            with gm.graph.inserting_before(node):
                call = gm.graph.call_function(make_kernel(), (node.args[0],))
            node.args = ((call,),)  # graphs return a tuple of outputs
            gm.recompile()
            program.compiled[name] = gm.forward
        return False

    class Plugin:
        @hookimpl
        def passkit_register_passes(self):
            return [codegen_closure]

    register_passkit_plugin(Plugin(), name="test-closure-codegen")
    folder = Path(os.environ[CACHE_ENV])
    pipeline = folder.parent / "closure.toml"
    pipeline.write_text('[[steps]]\npass = "functionalize"\n[[steps]]\npass = "test.codegen_closure"\n')
    for _ in range(2):
        compiled = passkit.aot_function(lambda x: x.sin() * 2, pipeline=str(pipeline))
        with torch.no_grad():
            x = torch.randn(3)
            torch.testing.assert_close(compiled(x), x.sin() * 2)
        assert compiled.passkit_reports[0].cache == "miss"  # looked up; what it compiled cannot be stored
    assert _entries(folder) == []
