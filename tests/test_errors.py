"""Every exit status in ``passkit.errors`` has its row in README's exit-code table."""

from __future__ import annotations

import re
from pathlib import Path

from passkit import errors

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tables_every_exit_code_and_no_other() -> None:
    codes = sorted({getattr(errors, name) for name in errors.__all__ if name.startswith("EXIT_")})
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", README.read_text(), re.MULTILINE)
    assert [int(code) for code, _ in rows] == codes == [0, 1, 2, 3, 4, 5]
    assert dict(rows)["5"].startswith("internal error in passkit or a plugin")
