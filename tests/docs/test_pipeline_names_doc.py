"""Every pipeline name the docs mention is a pipeline passkit or a plugin in plugins/ ships.

A name is a backticked or quoted word starting ``training``, ``inference``, ``debug`` or
``inductor-`` (``training-python``, ``"training-triton"``); a pipeline is a ``pipelines/*.toml``
of passkit or of a plugin, named by its file's stem. docs/pipelines.md once named
``training-noops``, which the example plugin no longer shipped.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([*REPO.glob("docs/*.md"), REPO / "README.md", *REPO.glob("plugins/*/README.md")])
NAME = re.compile(r"""[`"']((?:training|inference|debug)(?:-[a-z0-9]+)*|inductor(?:-[a-z0-9]+)+)[`"']""")


def shipped_pipelines() -> set[str]:
    files = [*REPO.glob("pipelines/*.toml"), *REPO.glob("plugins/*/*/pipelines/*.toml")]
    return {path.stem for path in files}


def test_the_docs_name_only_shipped_pipelines() -> None:
    shipped = shipped_pipelines()
    assert {"training", "training-python", "training-gelu-tanh", "training-triton"} <= shipped
    unknown = sorted(
        f"{doc.relative_to(REPO)}:{number}: {name}"
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        for name in NAME.findall(line)
        if name not in shipped
    )
    assert unknown == []


def test_the_example_plugin_section_names_its_pipeline() -> None:
    text = (REPO / "docs" / "pipelines.md").read_text()
    assert "`passkit-example` ships `training-gelu-tanh`" in text
