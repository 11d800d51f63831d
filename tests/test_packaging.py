"""Check that the built wheel, not the source tree, is a working passkit.

The test copies the files a build needs into a scratch folder, builds a wheel there, installs it
into a fresh virtual environment and runs passkit from a folder outside the repository. The fresh
environment sees the test's own environment (torch, pydantic, pluggy, click) through a ``.pth``
file, but the wheel's ``site-packages`` comes first on ``sys.path``, so ``import passkit`` must
find the installed copy; the test asserts that it does.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 15 s on an idle machine; plain `pytest` still runs it

REPO = Path(__file__).resolve().parents[1]
# What a build reads; passkit/pipelines is a symlink to ../pipelines in the source tree.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "passkit", "pipelines")
SHIPPED = ("debug", "export", "inference", "inference-python", "training", "training-python")
DEPENDENCIES = ("torch", "pydantic", "pluggy", "click", "numpy")

PROBE = """
import importlib.metadata, json, passkit

def describe(p):
    return {
        "source": str(p.source),
        "files": [str(f) for f in p.files],
        "settings": p.settings.model_dump(),
        "settings_origin": dict(p.settings_origin),
        "steps": [[s.id, s.pass_name, s.options.model_dump(), s.when, s.enabled] for s in p.steps],
    }

print(json.dumps({
    "module": passkit.__file__,
    "metadata": str(importlib.metadata.distribution("passkit").locate_file("")),
    "pipelines": {name: describe(passkit.load_pipeline(name)) for name in %r},
}))
""" % (SHIPPED,)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _venv_python(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _outer_site_dirs() -> list[str]:
    """Where this interpreter finds passkit's dependencies, wherever they were installed.

    Site directories, plus the folder holding each dependency, for environments that reach their
    packages through a ``.pth`` file rather than a site directory. Never the repository itself.
    """
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    for name in DEPENDENCIES:
        module = __import__(name)
        dirs.append(str(Path(module.__file__).parent.parent))
    return [d for d in dict.fromkeys(dirs) if not Path(d).resolve().is_relative_to(REPO)]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PASSKIT_", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"  # the .pth names the user site explicitly when it matters
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Build the wheel, install it into a fresh venv; returns the wheel, python and site-packages."""
    root = tmp_path_factory.mktemp("packaging")
    env = _clean_env()
    source = root / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        elif path.exists():
            shutil.copy2(path, source / name)
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(source)],
        root,
        env,
    )
    (wheel,) = dist.glob("passkit-*.whl")

    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=os.name != "nt").create(env_dir)
    python = _venv_python(env_dir)
    # --ignore-installed: an editable or system passkit visible to the venv must not stop the install.
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
         "--ignore-installed", str(wheel)],
        root,
        env,
    )
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root, env).strip())
    # Added after the install, so pip above saw only the fresh venv. addsitedir (not a bare path)
    # also runs the outer .pth files, e.g. editable plugins' import hooks.
    bridge = "".join(
        f"import site, sys; d = {d!r}; d in sys.path or site.addsitedir(d)\n" for d in _outer_site_dirs()
    )
    (purelib / "_passkit_test_outer_env.pth").write_text(bridge)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return {"wheel": wheel, "python": python, "purelib": purelib.resolve(), "cwd": elsewhere, "env_dir": env_dir}


def _inside(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder)


def test_wheel_ships_the_pipeline_files(installed: dict[str, Path]) -> None:
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = set(wheel.namelist())
    assert {f"passkit/pipelines/{name}.toml" for name in SHIPPED} <= names
    assert "passkit/pipeline/loader.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        text = wheel.read(entry_points).decode()
    assert "[torch_dynamo_backends]" in text and "passkit = passkit.cli:main" in text and "[pytest11]" in text
    assert "[passkit]" not in text  # built-ins are BUILTIN_PLUGINS, not entry points


def test_installed_wheel_resolves_the_shipped_pipelines(installed: dict[str, Path]) -> None:
    purelib = installed["purelib"]
    out = _run([str(installed["python"]), "-c", PROBE], installed["cwd"], _clean_env())
    probe = json.loads(out.strip().splitlines()[-1])
    assert _inside(probe["module"], purelib), f"imported {probe['module']}, not the wheel in {purelib}"
    assert not _inside(probe["module"], REPO)
    assert _inside(probe["metadata"], purelib)
    pipelines = probe["pipelines"]
    for name in SHIPPED:
        assert Path(pipelines[name]["source"]) == purelib / "passkit" / "pipelines" / f"{name}.toml"

    training, debug = pipelines["training"], pipelines["debug"]
    assert debug["files"] == [*training["files"], debug["source"]]
    assert debug["steps"] == training["steps"]
    assert [step[1] for step in training["steps"]] == [
        "regions", "functionalize", "decompose", "rewrite", "joint", "joint.inductor_passes", "collectives.reshard",
        "partition.min_cut", "fx.cse", "fx.dce", "collectives.bucket", "collectives.overlap", "codegen.inductor",
    ]
    assert [step[1] for step in pipelines["training-python"]["steps"]][-1] == "codegen.python"
    assert training["settings"]["verify"] == "off" and training["settings"]["dump"] == "off"
    assert (debug["settings"]["verify"], debug["settings"]["dump"]) == ("numerics", "all")
    # Origins name a shipped file as every listing does, whatever the install path.
    assert debug["settings_origin"]["verify"] == "passkit/pipelines/debug.toml"
    assert debug["settings_origin"]["on_error"] == "passkit/pipelines/training.toml"


def test_installed_cli_lists_the_wheel_pipelines(installed: dict[str, Path]) -> None:
    purelib = installed["purelib"]
    out = _run([str(installed["python"]), "-m", "passkit", "pipelines", "--json"], installed["cwd"], _clean_env())
    listed = {entry["name"]: entry["file"] for entry in json.loads(out)}
    for name in SHIPPED:
        assert Path(listed[name]) == purelib / "passkit" / "pipelines" / f"{name}.toml"
    script = installed["env_dir"] / ("Scripts/passkit.exe" if os.name == "nt" else "bin/passkit")
    assert script.is_file()
