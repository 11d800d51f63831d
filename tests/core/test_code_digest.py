"""A pass no plugin registered is fingerprinted by value: its code, its options and contract, the
values it closes over and the globals it reads (helpers followed), so that an edit in a
notebook changes it, and a value that cannot be hashed says so instead of keying anything."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from passkit.core.code_digest import Unhashable, code_digest

PASS = '''
import math

import torch

import passkit

aten = torch.ops.aten
LIMIT = 3


def helper(count):
    return min(count, LIMIT)


@passkit.graph_pass("nb.count", requires={"functional"})
def count(program, *, scale: float = 1.0) -> bool:
    """Count negations."""
    found = sum(1 for gm in program.graphs.values() for node in gm.graph.nodes if node.target is aten.neg.default)
    program.record_stat("negs", helper(found) * math.floor(scale))
    return False
'''


def notebook_pass(source: str = PASS) -> Any:
    """The pass that ``source`` (a notebook's cell) defines."""
    names: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(source), "nb.py", "exec"), names)
    return names["count"]


def fingerprint(source: str = PASS) -> str:
    return notebook_pass(source).fingerprint(by_value=True)


def test_the_same_code_has_the_same_fingerprint_in_every_process() -> None:
    here = fingerprint()
    assert fingerprint() == here  # another Pass object, compiled again from the same cell
    script = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n" \
             "from test_code_digest import fingerprint; print(fingerprint())"
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == here


@pytest.mark.parametrize("old, new", [
    ('record_stat("negs"', 'record_stat("negatives"'),  # the pass's own body
    ("scale: float = 1.0", "scale: float = 2.0"),  # an option's default
    ('requires={"functional"}', 'requires={"functional", "decomposed"}'),  # its contract
    ("LIMIT = 3", "LIMIT = 4"),  # a global a helper reads
    ("return min(count, LIMIT)", "return max(count, LIMIT)"),  # a helper's code
    ("LIMIT = 3", "LIMIT = 3\nUNREAD = [1, 2]"),  # only what it reads counts: still equal
], ids=["body", "default", "contract", "helper's global", "helper's code", "unread global"])
def test_an_edit_changes_the_fingerprint_where_the_code_or_what_it_reads_changes(old, new) -> None:
    edited = fingerprint(PASS.replace(old, new))
    assert (edited == fingerprint()) == ("UNREAD" in new)


def test_a_comment_or_a_blank_line_changes_nothing() -> None:
    assert fingerprint(PASS.replace('    """Count negations."""\n', '    """Count negations."""\n\n    # a note\n')) \
        == fingerprint()


def test_the_values_it_closes_over_count() -> None:
    def make(limit: int) -> Any:
        import passkit

        @passkit.graph_pass("nb.closure")
        def closure(program) -> bool:
            return limit > 0

        return closure

    assert make(1).fingerprint(by_value=True) == make(1).fingerprint(by_value=True)
    assert make(1).fingerprint(by_value=True) != make(2).fingerprint(by_value=True)


def test_a_value_that_cannot_be_hashed_names_itself() -> None:
    cell = PASS.replace("LIMIT = 3", "LIMIT = torch.tensor(3)")
    counting = notebook_pass(cell)
    assert counting.by_value_problem() == "the global 'LIMIT' of helper() is a Tensor, which passkit cannot hash"
    assert counting.fingerprint(by_value=True) != counting.fingerprint(by_value=True)  # a fresh one each time
    assert notebook_pass().by_value_problem() is None


def test_installed_code_is_named_not_walked() -> None:
    import math

    import torch

    # torch's own functions read a great many things; by name and version they are stable.
    assert code_digest([math.floor, torch.nn.functional.relu, torch.ops.aten.neg.default, torch.float32]) == \
        code_digest([math.floor, torch.nn.functional.relu, torch.ops.aten.neg.default, torch.float32])
    with pytest.raises(Unhashable, match="the value is a Tensor, which passkit cannot hash"):
        code_digest(torch.ones(1))


def test_a_function_that_calls_itself_is_hashed() -> None:
    source = "def walk(n):\n    return walk(n - 1) if n else 0\n"
    names: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "nb.py", "exec"), names)
    assert len(code_digest(names["walk"])) == 64
