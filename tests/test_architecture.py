"""The layers of docs/architecture.md hold: import-linter's contracts pass, and only
the ``passkit/_torch/`` package names torch's private modules (import-linter cannot express that one)."""

from __future__ import annotations

import ast
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


def test_import_layers_are_kept() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout


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
