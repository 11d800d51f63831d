"""A notebook's pass, with no plugin and no file: a dict pipeline that extends ``training``
compiles a model to eager's results, a second process loads it from the compile cache, and
editing the pass recompiles (the cache follows the pass's code, not a file or a version)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from passkit.cache.store import CACHE_ENV

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_PASS = ROOT / "tests" / "notebook_pass.py"

# What a notebook's cells hold, top to bottom; the last cell prints what the test reads.
NOTEBOOK = NOTEBOOK_PASS.read_text() + '''
import copy
import json


pipeline = {
    "pipeline": {"extends": "training"},
    "steps": [{"pass": fold_double_neg, "after": "decompose"}],
}


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(-(-self.up(x))))


torch.manual_seed(0)
model, x = Model(), torch.randn(5, 8)
eager = copy.deepcopy(model)
compiled = passkit.compile(model, pipeline=pipeline)
out = compiled(x)
out.sum().backward()
expected = eager(x)
expected.sum().backward()
report = compiled.passkit_reports[0]
print(report.table())
print(json.dumps({
    "cache": report.cache,
    "row": next(step for step in report.to_json()["steps"] if step["id"] == "nb.fold_double_neg"),
    "matches_eager": torch.allclose(out, expected, rtol=1e-4, atol=1e-5) and all(
        torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5) for p, q in zip(model.parameters(), eager.parameters())),
}))
'''


def _run(notebook: Path, cache: Path) -> dict:
    env = {**os.environ, CACHE_ENV: str(cache)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, notebook.name], cwd=notebook.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    *table, last = done.stdout.strip().splitlines()
    return {**json.loads(last), "table": "\n".join(table)}


@pytest.mark.slow
def test_a_notebook_pass_compiles_hits_the_cache_and_recompiles_when_edited(tmp_path: Path) -> None:
    notebook, cache = tmp_path / "nb.py", tmp_path / "cache"
    notebook.write_text(NOTEBOOK)

    cold = _run(notebook, cache)
    assert cold["cache"] == "miss" and cold["matches_eager"]
    assert (cold["row"]["pass_name"], cold["row"]["changed"], cold["row"]["stats"]) == (
        "nb.fold_double_neg", True, {"rewrites": 1})
    assert re.search(r"\n 4  nb\.fold_double_neg +nb\.fold_double_neg +yes .* rewrites=1\n", cold["table"])

    warm = _run(notebook, cache)  # a second process: the same code reads the same values
    assert warm["cache"] == "hit" and warm["matches_eager"]
    assert warm["row"]["stats"] == {"rewrites": 1}

    notebook.write_text(notebook.read_text().replace('record_stat("rewrites"', 'record_stat("folded"'))
    edited = _run(notebook, cache)  # the pass's source changed: compiled again, by the new code
    assert edited["cache"] == "miss" and edited["matches_eager"]
    assert edited["row"]["stats"] == {"folded": 1}
    assert len(list(cache.glob("*.entry"))) == 2
