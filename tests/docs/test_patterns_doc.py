"""docs/patterns.md: its from_trace example works as written, on a Linear's rank-3 output.

The example block is executed as a plugin module; a model file with a ``Linear`` and an exact
GELU is compiled through ``torch.compile`` (as ``passkit run`` captures, with source lines)
with the example's set named in a ``rewrite`` step with ``expect_match = true``. The miss the
page quotes is produced here and compared with the page's text.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import passkit
from passkit.patterns import PatternSet, from_trace

DOC = Path(__file__).resolve().parents[2] / "docs" / "patterns.md"
SECTION = re.compile(r"^## Write a pattern\n(.*?)^## ", re.MULTILINE | re.DOTALL)
EXAMPLE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
MODEL = '''"""A model whose GELU follows a Linear: its input has rank 3."""

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return F.gelu(h) * 2
'''


def doc_example() -> types.ModuleType:
    (section,) = SECTION.findall(DOC.read_text(encoding="utf-8"))
    module = types.ModuleType("patterns_doc_example")
    exec(compile(EXAMPLE.findall(section)[0], f"{DOC.name}: Write a pattern", "exec"), module.__dict__)
    return module


@pytest.fixture
def model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("model", None)
    return importlib.import_module("model")


def _compile(register_passkit_plugin, tmp_path: Path, pattern_set: PatternSet, module: types.ModuleType):
    class Plugin:
        @passkit.hookimpl
        def passkit_register_patterns(self) -> dict:
            return {"acme:gelu_tanh": pattern_set}

    register_passkit_plugin(Plugin(), name="acme")
    path = tmp_path / "gelu.toml"
    path.write_text(
        '[pipeline]\nname = "gelu"\nextends = "training-python"\n\n'
        '[[steps]]\nid = "gelu_tanh"\npass = "rewrite"\npatterns = ["acme:gelu_tanh"]\nexpect_match = true\n'
        'after = "decompose"\n'
    )
    backend = passkit.backend(str(path))
    torch.manual_seed(0)
    block = module.Block()
    return block, torch.compile(block, backend=backend, fullgraph=True), backend


def test_the_example_rewrites_gelu_on_a_linear_output_of_rank_3(register_passkit_plugin, tmp_path, model_file) -> None:
    example = doc_example()
    block, compiled, backend = _compile(register_passkit_plugin, tmp_path, example.ACME, model_file)
    x = torch.randn(2, 3, 5)
    out = compiled(x)
    with torch.no_grad():
        torch.testing.assert_close(out, F.gelu(block.linear(x), approximate="tanh") * 2)
    (report,) = backend.reports
    (record,) = [r for r in report.records if r.id == "gelu_tanh"]
    assert record.stats["applied"] == {"acme:gelu_tanh:exact_gelu": 1}


def test_a_pinned_rank_misses_with_the_reason_the_page_quotes(register_passkit_plugin, tmp_path, model_file) -> None:
    example = doc_example()
    pinned = from_trace(example.exact_gelu, [torch.empty(3, 5)], example.tanh_gelu, pin_ranks=True)
    pattern_set = dataclasses.replace(example.ACME, patterns=(pinned,))
    _, compiled, _ = _compile(register_passkit_plugin, tmp_path, pattern_set, model_file)
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(2, 3, 5))
    message = str(info.value)
    line = MODEL.splitlines().index("        return F.gelu(h) * 2") + 1
    quoted = (
        "pattern 'acme:gelu_tanh' matched nothing; acme:gelu_tanh:exact_gelu: nearest node gelu "
        f"(model.py:{line}): node gelu (aten.gelu.default) fails Where(rank=2)"
    )
    assert f"failed: PatternError: {quoted} (after: " in message
    assert f"   {quoted}\n" in DOC.read_text(encoding="utf-8")
