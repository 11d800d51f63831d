"""docs/pipelines.md's "Pipelines in Python" works as written: its example loads and explains as
shown, each message of its error table is what the mistake gives, and its "not cached" line is
what a pass reading a tensor gets. The doc's code runs as a notebook saved as ``nb.py``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import passkit

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipelines.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Pipelines in Python")
    return text[start : text.index("\n## ", start + 1)]


def blocks(lang: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(section()) if m.group(1) == lang]


def matches_in_order(expected: list[str], actual: str) -> None:
    """Each expected line matches a later printed line: ``...`` is any text, spaces any spaces."""
    lines, position = [line.strip() for line in actual.splitlines()], 0
    for wanted in expected:
        if wanted.strip() == "...":
            continue
        words = [r"\s+".join(map(re.escape, piece.split())) for piece in wanted.strip().split("...")]
        pattern = re.compile(".*".join(words))
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        assert position < len(lines), f"no line matching {wanted!r} (in order) in:\n{actual}"
        position += 1


def run_as_notebook(code: str, names: dict[str, Any] | None = None) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", **(names or {})}
    exec(compile(code, "nb.py", "exec"), namespace)
    return namespace


def test_the_example_loads_and_explains_as_shown(capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = [block for block in blocks("python") if '"nb.count_ops"' in block]
    pipeline = run_as_notebook(code)["pipeline"]
    shown = next(block for block in blocks("text") if block.startswith("pipeline counted"))
    matches_in_order(shown.splitlines(), capsys.readouterr().out)
    assert [step.id for step in pipeline.steps if step.unregistered] == ["count.before", "count.after"]


# What each row of the doc's error table is about, as the call on line 12 of nb.py.
MISTAKES = {
    "bad option value": "passkit.load_pipeline({'steps': [{'pass': knob, 'max_rewrites': 'x'}]})",
    "a setting at the top": "passkit.load_pipeline({'verify': 'facts'})",
    "`disable` at the top": "passkit.load_pipeline({'disable': ['fx.dce']})",
    "unknown top-level key": "passkit.load_pipeline({'setings': {}})",
    "`steps` not a list": "passkit.load_pipeline({'steps': {'pass': 'fx.dce'}})",
    "a table not a dict": "passkit.load_pipeline({'settings': [('verify', 'facts')]})",
    "a step not a dict": "passkit.load_pipeline({'steps': ['fx.dce']})",
    "a function that is no pass": "passkit.load_pipeline({'steps': [{'pass': fold}]})",
    "a pass named like a registered one": "passkit.load_pipeline({'steps': [{'pass': my_dce}]})",
    "two passes of one name": "passkit.load_pipeline({'steps': [{'pass': 'functionalize'}, {'pass': knob}, "
                              "{'pass': other_knob, 'id': 'again'}]})",
}


def _doc_errors() -> dict[str, str]:
    rows = re.findall(r"^\| (.+?) \| `(nb\.py:12: .+)` \|$", section(), re.MULTILINE)
    return dict(rows)


def test_the_error_table_shows_every_mistake_it_names() -> None:
    assert sorted(_doc_errors()) == sorted(MISTAKES)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_error_in_the_table_is_what_the_mistake_gives(mistake: str) -> None:
    helpers = {
        "knob": passkit.graph_pass("nb.knob", requires={"functional"})(knob),
        "other_knob": passkit.graph_pass("nb.knob", requires={"functional"})(fold),
        "my_dce": passkit.graph_pass("fx.dce")(fold),
        "fold": fold,
    }
    code = "\n" * 11 + MISTAKES[mistake]
    with pytest.raises(passkit.PipelineError) as raised:
        run_as_notebook(code, {"passkit": passkit, **helpers})
    assert str(raised.value) == _doc_errors()[mistake]


def knob(program: Any, *, max_rewrites: int = 100) -> bool:
    return False


def fold(program: Any) -> bool:
    return False


def test_the_not_cached_line_is_what_a_pass_reading_a_tensor_gets() -> None:
    (shown,) = [block.strip() for block in blocks("text") if block.startswith("not cached:")]
    code = (
        "import torch\nimport passkit\nweights = torch.ones(2)\n\n"
        "@passkit.graph_pass('nb.knob', requires={'functional'})\n"
        "def knob(program) -> bool:\n    return bool(weights.sum() < 0)\n\n"
        "def fn(x):\n    return x.sin()\n\n"
        "compiled = passkit.aot_function(fn, pipeline={'pipeline': {'extends': 'training-python'}, "
        "'steps': [{'pass': knob, 'after': 'functionalize'}]})\n"
    )
    compiled = run_as_notebook(code)["compiled"]
    compiled(torch.randn(3, requires_grad=True)).sum().backward()
    table = compiled.passkit_reports[0].table()
    assert table.splitlines()[-1] == shown
