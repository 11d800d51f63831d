"""A pass's options, built from its keyword-only parameters, take values of their annotated
types only: a boolean is no integer and a string no number, as docs/writing-passes.md says."""

from __future__ import annotations

import pytest

import passkit


@passkit.graph_pass("acme.count")
def _count(program: passkit.Program, *, max_rewrites: int = 100, scale: float = 1.0,
           label: str | None = None, keep: tuple[str, ...] = ()) -> bool:
    """Counts."""
    return False


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"max_rewrites": True}, "max_rewrites\n  Input should be a valid integer"),
        ({"max_rewrites": "5"}, "max_rewrites\n  Input should be a valid integer"),
        ({"scale": "1.5"}, "scale\n  Input should be a valid number"),
        ({"label": 3}, "label\n  Input should be a valid string"),
    ],
    ids=["bool-for-int", "string-for-int", "string-for-float", "int-for-string"],
)
def test_a_value_of_another_type_is_refused(values, problem) -> None:
    with pytest.raises(Exception) as raised:
        _count.options_model(**values)
    assert problem in str(raised.value)


def test_integers_fill_floats_and_arrays_fill_tuples() -> None:
    options = _count.options_model(max_rewrites=5, scale=2, keep=["a", "b"])
    assert (options.max_rewrites, options.scale, options.keep) == (5, 2.0, ("a", "b"))
    assert isinstance(options.scale, float)
