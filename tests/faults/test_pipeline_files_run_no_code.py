"""Loading a pipeline file never runs code from it: no imports, no evaluation of strings.

Every string a file holds is data. The test loads files full of Python (in pass names, option
values, ``extends``, step ids, settings) while an audit hook watches for code being compiled,
executed or imported, and checks that the marker file the payloads would create never appears.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from passkit.errors import PipelineError
from passkit.pipeline import load_pipeline
from passkit.core.registry import get_registry

_WATCHING: list[list[tuple[str, str]]] = []


def _audit(event: str, args: tuple) -> None:
    if _WATCHING and event in ("exec", "compile", "import", "os.system", "subprocess.Popen", "builtins.input"):
        _WATCHING[-1].append((event, repr(args)[:120]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; it records only while a test watches

PAYLOADS = [
    'pass = "__import__(\'os\').system(\'touch {marker}\')"',
    'pass = "decompose"\ntables = ["__import__(\'os\').system(\'touch {marker}\')"]',
    'pass = "partition.default"\nid = "exec(\'open(\\"{marker}\\", \\"w\\")\')"',
    'pass = "codegen.python"\nfast_calls = "eval(\'open(\\"{marker}\\", \\"w\\")\')"',
]


def _files(tmp_path: Path) -> list[tuple[str, str]]:
    marker = tmp_path / "pwned"
    evil_module = tmp_path / "evil_module.py"
    evil_module.write_text(f"open({str(marker)!r}, 'w').close()\n")
    files = [(f"step{i}.toml", "[[steps]]\n" + p.format(marker=marker)) for i, p in enumerate(PAYLOADS)]
    files += [
        ("extends_module.toml", '[pipeline]\nextends = "evil_module"\n'),
        ("extends_py.toml", f'[pipeline]\nextends = "{evil_module}"\n'),
        ("settings.toml", f'[settings]\ndump_dir = "$(touch {marker})"\nverify = "__import__(\'os\')"\n'),
        ("override.toml", '[pipeline]\nextends = "training-python"\n[override.decompose]\n'
                          f'keep.add = ["__import__(\'os\').system(\'touch {marker}\')"]\n'),
        ("name.toml", f'[pipeline]\nname = "{{{{ open(\'{marker}\', \'w\') }}}}"\n[[steps]]\npass = "codegen.python"\n'),
    ]
    return files


def test_pipeline_files_never_import_or_evaluate_what_they_contain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # so an import of evil_module would succeed if tried
    registry = get_registry()
    load_pipeline("training-python", registry=registry)  # warm up: lazy imports of passkit itself
    outcomes = {}
    for name, text in _files(tmp_path):
        (tmp_path / name).write_text(text)
        _WATCHING.append([])
        try:
            load_pipeline(name, registry=registry)
            outcomes[name] = "loaded"
        except PipelineError as exc:
            outcomes[name] = str(exc)
        finally:
            events = _WATCHING.pop()
        assert events == [], f"{name}: loading ran code: {events}"
    assert not (tmp_path / "pwned").exists()
    assert "evil_module" not in sys.modules
    # Each payload was rejected as data (or kept as an inert string), never run.
    assert outcomes["step0.toml"].startswith("step0.toml: steps[0]: unknown pass \"__import__('os')")
    assert outcomes["extends_module.toml"].startswith("extends_module.toml: extends: unknown pipeline 'evil_module'; ")
    assert outcomes["name.toml"] == "loaded"


def test_the_audit_hook_sees_evaluation_and_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch above is not blind: it records an ``eval`` and a fresh import."""
    (tmp_path / "fresh_module_for_audit.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _WATCHING.append([])
    try:
        eval("1 + 1")  # noqa: S307 - the point of the test
        __import__("fresh_module_for_audit")
    finally:
        events = [event for event, _ in _WATCHING.pop()]
        sys.modules.pop("fresh_module_for_audit", None)
    assert "compile" in events and "exec" in events and "import" in events
