"""README says where the reports are, whichever way a model comes in: ``torch.compile`` with
passkit's backend or with passkit's passes in Inductor's slots puts them in ``passkit.reports()``,
and an Inductor cache hit is said to leave a report too."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
USE_IT = re.compile(r"^## Use it\n\n```python\n(.*?)^```\n(.*?)^## ", re.MULTILINE | re.DOTALL)


def test_the_use_it_section_shows_where_torch_compiles_reports_are() -> None:
    match = USE_IT.search(README)
    assert match is not None
    code, text = match.groups()
    assert "print(passkit.reports()[-1].table())" in code
    assert "`compiled.passkit_reports` for `passkit.compile`" in text
    assert re.search(r"for `torch\.compile`, with `backend=\"passkit\"`, `passkit\.backend\(\.\.\.\)`\s+or "
                     r"`inductor_options\(\.\.\.\)`, `passkit\.reports\(\)`", text)
    assert "Inductor cache hit" in text and '`cache = "inductor"`' in text
