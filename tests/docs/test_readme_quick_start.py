"""README's quick start is two commands, and CI (.ci/run) runs exactly those two.

The first installs passkit with its test dependencies and the example plugin, then runs the main
job; it leaves out the Triton plugin (Triton is 1 GB installed that a CPU cannot run). The second
adds the Triton plugin (its tests run on the CPU under ``TRITON_INTERPRET=1``, and in CI a missing
Triton fails them), then runs the suite.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^## Quick start\n\n```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def quick_start() -> list[str]:
    match = BLOCK.search((REPO / "README.md").read_text())
    assert match is not None, "README.md has no '## Quick start' bash block"
    return match.group(1).strip().splitlines()


def ci_commands() -> list[str]:
    """The commands .ci/run traces (between ``set -x`` and ``set +x``), less its own plumbing:
    shell assignments (``stage=...`` names the step a failure line reports) and the
    ``|| exit $?`` that ``set -e`` needs after an ``&&`` list."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    traced = lines[lines.index("set -x") + 1 : lines.index("set +x")]
    commands = [line.removesuffix(" || exit $?") for line in traced if line.strip()]
    return [line for line in commands if not re.match(r"^\w+=", line)]


def test_readme_quick_start_is_two_commands_that_ci_runs_verbatim() -> None:
    commands = quick_start()
    assert commands == [
        'pip install -e ".[dev]" -e plugins/passkit-example && passkit run pipelines/training.toml',
        "pip install -e plugins/passkit-triton && pytest",
    ]
    assert ci_commands() == commands


def test_the_first_command_leaves_out_triton() -> None:
    user, developer = quick_start()
    assert "passkit-triton" not in user and user.startswith('pip install -e ".[dev]"')
    assert "plugins/passkit-triton" in developer and developer.endswith("&& pytest")


def test_the_suite_runs_the_triton_plugin_tests() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"plugins/passkit-triton/tests"' in pyproject
