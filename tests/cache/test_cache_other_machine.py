"""A process on another machine loads ``codegen.inductor`` graphs from the shared cache without
generating code or running the C++ compiler: each entry carries the files Inductor's folder held
for its graphs (``passkit/_torch/inductor_files.py``). Each process below has a passkit folder
and an Inductor folder (``TORCHINDUCTOR_CACHE_DIR``) of its own, as two machines do; the server is
a real ``redis-server``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cache_child import compile_and_report
from passkit._torch import built_files_installed, inductor_files
from passkit.cache.store import CACHE_ENV
from passkit.cli import main

CHILD = Path(__file__).resolve().parents[1] / "cache_child.py"
ROOT = Path(__file__).resolve().parents[2]


def _machine(tmp_path: Path, name: str, url: str | None = None, **keys: Path) -> dict[str, str]:
    """A child's environment with passkit and Inductor folders of its own, as on machine ``name``."""
    env = {**os.environ, CACHE_ENV: str(tmp_path / name / "passkit"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name / "inductor"),
           "CHILD_PIPELINE": "training"}
    if url is not None:
        env["PASSKIT_CACHE_URL"] = url
    env.update({name: str(path) for name, path in keys.items()})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _run(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_another_machine_loads_inductors_code_and_kernels_from_the_server_and_builds_nothing(server, tmp_path) -> None:
    url, _ = server
    result = CliRunner().invoke(main, ["cache", "keygen", str(tmp_path / "keys")])
    assert result.exit_code == 0, result.output
    first = _run(_machine(tmp_path, "first", url, PASSKIT_CACHE_SIGNING_KEY=tmp_path / "keys" / "passkit-cache.key"))
    assert first["cache"] == "miss" and first["cpp_builds"] > 0 and first["inductor"]["miss"] == 2

    # A machine whose CPU Inductor has probed (the probes build libraries of their own, once a
    # machine), and whose passkit and Inductor folders are otherwise empty.
    probes = tmp_path / "second" / "inductor" / "passkit"
    probes.mkdir(parents=True)
    for answer in (tmp_path / "first" / "inductor" / "passkit").glob("cpu-probes-*.json"):
        shutil.copy(answer, probes)
    second = _run(_machine(tmp_path, "second", url, PASSKIT_CACHE_TRUSTED_KEYS=tmp_path / "keys" / "passkit-cache.pub"))
    assert (second["cache"], second["source"]) == ("hit", "server")
    assert second["inductor"] == {"hit": 2, "miss": 0, "bypass": 0}  # forward and backward: no code generated
    assert second["cpp_builds"] == 0  # no kernel, bundle or precompiled header built or checked
    assert (second["out"], second["grads"]) == (first["out"], first["grads"])
    torch.testing.assert_close(torch.tensor(second["out"]), torch.tensor(second["eager_out"]), rtol=1e-4, atol=1e-5)
    for grad, eager in zip(second["grads"], second["eager_grads"]):
        torch.testing.assert_close(torch.tensor(grad), torch.tensor(eager), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_an_entry_past_the_size_cap_carries_no_files_and_another_machine_lowers_its_graphs_again(tmp_path,
                                                                                              monkeypatch) -> None:
    monkeypatch.setattr(inductor_files, "MAX_BYTES", 0)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "first" / "passkit"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first" / "inductor"))
    monkeypatch.setenv("CHILD_PIPELINE", "training")
    first = compile_and_report()  # in this process: one interpreter start less
    assert first["cache"] == "miss"
    env = _machine(tmp_path, "second")
    env[CACHE_ENV] = str(tmp_path / "first" / "passkit")  # the same entries, another Inductor folder
    second = _run(env)
    assert second["cache"] == "hit" and second["passes_run"] == 0
    assert second["inductor"] == {"hit": 0, "miss": 2, "bypass": 0}  # Inductor lowered the stored graphs itself
    assert (second["out"], second["grads"]) == (first["out"], first["grads"])


def test_a_load_writes_the_files_its_folder_lacks_whole_and_leaves_the_others(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "kept.so").write_bytes(b"already here")
    files = {"ab/kept.so": b"from the entry", "cd/new.so": b"library", "fxgraph/ef/key/entry": b"graph",
             "../outside": b"never", "/absolute": b"never"}
    with built_files_installed(files):
        pass
    assert (tmp_path / "ab" / "kept.so").read_bytes() == b"already here"
    assert (tmp_path / "cd" / "new.so").read_bytes() == b"library"
    assert (tmp_path / "fxgraph" / "ef" / "key" / "entry").read_bytes() == b"graph"
    assert not (tmp_path.parent / "outside").exists()
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["ab/kept.so", "cd/new.so", "fxgraph/ef/key/entry"]  # no temporary file left behind
