"""The layers of docs/architecture.md hold: import-linter's contracts pass (and fail on an upward
import), only the ``passkit/_torch/`` package names torch's private modules (import-linter cannot
express that one), and the tree keeps its shape: few modules at the top, none over the house
limit, a docstring saying what each package owns."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "passkit"
PRIVATE_ROOTS = ("torch._", "torch.fx.experimental.proxy_tensor", "torch.utils._pytree")


def _private_names(path: Path) -> list[str]:
    """Every ``torch._x`` a module imports or reaches as an attribute, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            names = [f"torch.{node.attr}"]
        found += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names if name.startswith(PRIVATE_ROOTS)]
    return found


def test_only_the_torch_bridge_names_private_torch() -> None:
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py")) if "_torch" not in path.relative_to(PACKAGE).parts for hit in _private_names(path)]
    assert offenders == []


def test_the_private_torch_check_finds_a_private_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import torch\nfrom torch._subclasses import FakeTensor\nx = torch._C._set_grad_enabled\n")
    assert [hit.split(" ", 1)[1] for hit in _private_names_in(module, tmp_path)] == [
        "torch._subclasses", "torch._subclasses.FakeTensor", "torch._C",
    ]


def _private_names_in(path: Path, root: Path) -> list[str]:
    global REPO
    saved, REPO = REPO, root
    try:
        return _private_names(path)
    finally:
        REPO = saved


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the ``passkit`` package found first from ``root`` (the repository, or
    a copy of it), with ``root``'s contracts."""
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([lint, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_import_layers_are_kept() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    """The contracts can fail: the pass framework importing a front end is caught."""
    shutil.copytree(PACKAGE, tmp_path / "passkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / "passkit" / "core" / "report.py"
    planted.write_text(planted.read_text() + "\nimport passkit.frontends.api  # planted: an upward import\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "0 broken" not in result.stdout
    assert "passkit.core.report -> passkit.frontends.api (l." in result.stdout


def test_few_modules_sit_at_the_top_of_the_package() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def test_no_module_is_over_the_house_limit() -> None:
    sources = [*PACKAGE.rglob("*.py"), *(REPO / "plugins").rglob("*.py")]
    over = {str(path.relative_to(REPO)): n for path in sources if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert over == {}


def test_each_package_says_what_it_owns() -> None:
    silent = [str(init.relative_to(REPO)) for init in PACKAGE.rglob("__init__.py")
              if not ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))]
    assert silent == []


def _compile_warnings(paths: list[Path]) -> list[str]:
    """What compiling each file warns about (an invalid escape such as ``\\ s`` in a docstring is a
    SyntaxWarning on Python 3.12, printed at every import on the GPU machine's Python)."""
    import warnings

    found = []
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
        found += [f"{path.name}:{w.lineno} {w.message}" for w in caught]
    return found


def test_sources_compile_without_warnings() -> None:
    sources = [*PACKAGE.rglob("*.py"), *(REPO / "plugins").rglob("*.py"), *(REPO / "benchmarks").glob("*.py"),
               REPO / "tools" / "gpu-check", REPO / "tools" / "fake-h200-compile"]
    assert _compile_warnings(sources) == []


def test_the_compile_warning_check_finds_an_invalid_escape(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""``Event``\\ s"""\n')
    assert [hit.split(" ", 1)[0] for hit in _compile_warnings([module])] == ["m.py:1"]


# Names that read or compare torch's version. Outside ``passkit/_torch`` nothing may branch on
# the release it runs on: ``passkit/_torch/versions.py`` owns the flags (docs/torch-versions.md).
VERSION_READS = ("torch.__version__", "torch.version", "TorchVersion", "TORCH_2_", "torch_release", "TORCH_RELEASE")


def _version_reads(path: Path, root: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.relative_to(root)}:{number} {line.strip()}" for number, line in enumerate(lines, 1)
            if any(name in line for name in VERSION_READS)]


def test_only_the_torch_bridge_asks_which_torch_runs() -> None:
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py")) if "_torch" not in path.relative_to(PACKAGE).parts
                 for hit in _version_reads(path, REPO)]
    assert offenders == []


def test_the_version_check_finds_a_branch_on_the_torch_version(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import torch\nif torch.__version__ >= '2.15':\n    pass\nfrom passkit._torch.versions import TORCH_2_15\n")
    assert [hit.split(" ", 1)[0] for hit in _version_reads(module, tmp_path)] == ["m.py:2", "m.py:4"]
