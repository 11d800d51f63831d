"""A missing optional dependency skips a test on a developer's machine and fails it in CI."""

from __future__ import annotations

import pytest

from dependencies import require_module, require_program


def test_outside_ci_a_missing_module_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_module("passkit_no_such_module", "pip install it")
    assert str(skipped.value).startswith("passkit_no_such_module (No module named 'passkit_no_such_module') is not installed (pip install it)")


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_missing_module_or_program_fails(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="CI must have it, so this test fails rather than skips"):
        require_module("passkit_no_such_module")
    with pytest.raises(pytest.fail.Exception, match=r"^passkit-no-such-program is not installed \(apt-get install it\); CI must"):
        require_program("passkit-no-such-program", install="apt-get install it")


def test_a_present_dependency_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert require_module("json").dumps([]) == "[]"
    assert require_program("passkit-no-such-program", "sh", install="").endswith("/sh")
