"""One tolerance rule: ``passkit run``, ``verify = "numerics"`` and ``passkit bisect`` agree on the
planted tanh GELU, and each prints the rtol/atol it held the results to.

``planted_gelu.mlp`` is scaled so that the tanh approximation moves its results by about 3e-4:
beyond ``planted.gelu_tanh``'s declared (1e-3, 1e-4), well inside ``planted.gelu_tanh_loose``'s
(5e-2, 1e-2) and the ``planted_gelu`` pattern set's (5e-2, 1e-2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import planted_gelu
from passkit.cli import main

pytestmark = pytest.mark.slow

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")
MODEL = ["--model", "planted_gelu:mlp"]
TIGHT = "(rtol 0.001, atol 0.0001)"
LOOSE = "(rtol 0.05, atol 0.01)"
DIFF = r"\d\.\de-0\d"  # a verdict's max |diff|: 3.1e-04


def _pipeline(folder: Path, name: str, step: str, *, verify: bool = False) -> str:
    """``name.toml``: the debugging tests' fixed pipeline with ``step`` (a TOML body) after ``decompose``."""
    settings = '[settings]\nverify = "numerics"\n\n' if verify else ""
    (folder / f"{name}.toml").write_text(
        f'[pipeline]\nname = "{name}"\nextends = "{FIXED_TRAINING}"\n\n{settings}[[steps]]\n{step}after = "decompose"\n'
    )
    return f"{name}.toml"


def _pass(name: str) -> str:
    return f'pass = "{name}"\n'


def _rewrite(pattern_set: str) -> str:
    return f'pass = "rewrite"\npatterns = ["{pattern_set}"]\nexpect_match = true\n'


@pytest.fixture
def planted(register_passkit_plugin, workdir: Path) -> Path:
    register_passkit_plugin(planted_gelu, name="planted_gelu")
    return workdir


def test_beyond_the_declared_tolerance_run_verify_and_bisect_all_reject_it(cli, planted) -> None:
    run = cli.invoke(main, ["run", _pipeline(planted, "tight", _pass("planted.gelu_tanh")), *MODEL])
    assert run.exit_code == 1, run.output
    assert re.fullmatch(
        rf"MISMATCH: tight.toml on planted_gelu:mlp \(training\) vs eager: outputs max \|diff\| {DIFF}, "
        rf"grads max \|diff\| {DIFF} \(rtol 0.001, atol 0.0001\); first mismatch: output\[0\]: max \|diff\| \S+ \(\+\d+ more\)",
        run.stdout.splitlines()[-1],
    ), run.stdout

    verified = cli.invoke(main, ["run", _pipeline(planted, "vtight", _pass("planted.gelu_tanh"), verify=True), *MODEL])
    assert verified.exit_code == 1, verified.output
    error = verified.stderr.splitlines()[-1]
    assert re.fullmatch(
        r"vtight.toml: steps\[0\] \(planted.gelu_tanh\) changed numerics: max \|diff\| \S+ in output\[0\] of graph main "
        r"\(rtol 0.001, atol 0.0001\) \(reproducer: \S+\)",
        error,
    ), error

    bisected = cli.invoke(main, ["bisect", "tight.toml", *MODEL])
    assert bisected.exit_code == 1, bisected.output
    lines = bisected.stdout.splitlines()
    assert lines[0] == "first bad step: tight.toml: steps[0] (planted.gelu_tanh)"
    assert lines[1].startswith("  graph 1, training: numerics: changed numerics: max |diff| ")
    assert lines[1].endswith(f" in output[0] of graph main {TIGHT}")
    assert lines[2] == "minimal pipeline: tight-minimal.toml (3 steps: functionalize, planted.gelu_tanh, codegen.python), reproduces"


def test_a_change_only_gradients_show_is_rejected_by_run_verify_and_bisect_alike(cli, planted) -> None:
    # mlp_grads' outputs move by less than (1e-3, 1e-4) allows, its weight gradients by more. run
    # used to backpropagate a mean, which shrank every gradient difference by the output's size
    # and said ok where verify and bisect said no; all three now send the same seeded gradient.
    grads_model = ["--model", "planted_gelu:mlp_grads"]
    run = cli.invoke(main, ["run", _pipeline(planted, "tight", _pass("planted.gelu_tanh")), *grads_model])
    assert run.exit_code == 1, run.output
    assert re.fullmatch(
        rf"MISMATCH: tight.toml on planted_gelu:mlp_grads \(training\) vs eager: outputs max \|diff\| {DIFF}, "
        r"grads max \|diff\| 1.4e-03 \(rtol 0.001, atol 0.0001\); first mismatch: grad\[0.weight\]: max \|diff\| 0.00142 \(\+\d+ more\)",
        run.stdout.splitlines()[-1],
    ), run.stdout

    verified = cli.invoke(main, ["run", _pipeline(planted, "vtight", _pass("planted.gelu_tanh"), verify=True), *grads_model])
    assert verified.exit_code == 1, verified.output
    # verify and bisect name the gradient as run does: by its parameter.
    assert " changed numerics: max |diff| 0.00142 in grad[0.weight] of graph main (rtol 0.001, atol 0.0001) " in verified.stderr

    bisected = cli.invoke(main, ["bisect", "tight.toml", *grads_model])
    assert bisected.exit_code == 1, bisected.output
    assert bisected.stdout.splitlines()[1] == (
        f"  graph 1, training: numerics: changed numerics: max |diff| 0.00142 in grad[0.weight] of graph main {TIGHT}"
    )


def test_within_the_declared_tolerance_run_verify_and_bisect_all_accept_it(cli, planted) -> None:
    run = cli.invoke(main, ["run", _pipeline(planted, "loose", _pass("planted.gelu_tanh_loose")), *MODEL])
    assert run.exit_code == 0, run.output
    assert re.fullmatch(
        rf"ok: loose.toml on planted_gelu:mlp \(training\) vs eager: outputs max \|diff\| {DIFF}, "
        rf"grads max \|diff\| {DIFF} \(rtol 0.05, atol 0.01\)",
        run.stdout.splitlines()[-1],
    ), run.stdout

    verified = cli.invoke(main, ["run", _pipeline(planted, "vloose", _pass("planted.gelu_tanh_loose"), verify=True), *MODEL])
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.splitlines()[-1].endswith(LOOSE)

    bisected = cli.invoke(main, ["bisect", "loose.toml", *MODEL])
    assert bisected.exit_code == 0, bisected.output
    assert bisected.stdout.splitlines()[-1] == (
        f"every step is good: loose.toml on planted_gelu:mlp (1 graph(s)) agrees with the captured program {LOOSE}"
    )


def test_a_rewrite_step_declares_the_tolerance_of_its_pattern_sets(cli, planted) -> None:
    declared = cli.invoke(main, ["run", _pipeline(planted, "set", _rewrite("planted_gelu"), verify=True), *MODEL])
    assert declared.exit_code == 0, declared.output
    assert declared.stdout.splitlines()[-1].endswith(LOOSE)
    bisected = cli.invoke(main, ["bisect", "set.toml", *MODEL])
    assert (bisected.exit_code, bisected.stdout.splitlines()[-1].endswith(LOOSE)) == (0, True), bisected.output

    # The same rewrite from a set that declares nothing is held to the pipeline's own tolerance.
    undeclared = cli.invoke(main, ["run", _pipeline(planted, "bare", _rewrite("planted_gelu_undeclared")), *MODEL])
    assert undeclared.exit_code == 1, undeclared.output
    assert " (rtol 0.0001, atol 1e-05); first mismatch: output[0]: " in undeclared.stdout.splitlines()[-1]


def test_the_run_report_and_json_carry_the_verdict(cli, planted) -> None:
    file = _pipeline(planted, "tight", _pass("planted.gelu_tanh"))
    result = cli.invoke(main, ["run", file, *MODEL, "--report", "run.html", "--json", "run.json"])
    assert result.exit_code == 1, result.output
    page = (planted / "run.html").read_text()
    assert '<p class="verdict bad"><b>verdict: MISMATCH vs eager (rtol 0.001, atol 0.0001), exit code 1</b></p>' in page
    assert re.search(rf'<tr class="failed"><td>output\[0\]</td><td class="num">{DIFF}</td><td>MISMATCH</td></tr>', page)
    assert re.search(rf'<tr( class="failed")?><td>grad\[fc1.weight\]</td><td class="num">{DIFF}</td><td>(ok|MISMATCH)</td></tr>', page)
    data = json.loads((planted / "run.json").read_text())
    assert data["verdict"]["outcome"] == "mismatch" and data["verdict"]["exit_code"] == 1
    assert (data["verdict"]["rtol"], data["verdict"]["atol"]) == (1e-3, 1e-4)
    labels = [value["label"] for value in data["verdict"]["values"]]
    assert labels == ["output[0]", "grad[fc1.weight]", "grad[fc1.bias]", "grad[fc2.weight]", "grad[fc2.bias]"]
    assert data["reports"][0]["verdict"] == data["verdict"]


def test_export_holds_the_written_program_to_the_tolerance_its_steps_declare_on_a_miss_and_a_hit(cli, planted) -> None:
    (planted / "loose-export.toml").write_text(
        '[pipeline]\nname = "loose-export"\nextends = "export"\n\n'
        '[[steps]]\npass = "planted.gelu_tanh_loose"\nafter = "functionalize"\n'
    )
    tight = planted / "tight-export.toml"
    tight.write_text((planted / "loose-export.toml").read_text().replace("gelu_tanh_loose", "gelu_tanh").replace("loose-export", "tight-export"))
    caches = []
    for _ in range(2):  # compiled, then loaded from the compile cache
        result = cli.invoke(main, ["export", "loose-export.toml", *MODEL, "-o", "m.pt2", "--json"])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        assert (payload["ok"], payload["rtol"], payload["atol"]) == (True, 5e-2, 1e-2)
        assert result.stderr.splitlines()[-1].endswith(f" vs eager: outputs max |diff| {payload['outputs_max_diff']:.1e} {LOOSE}")
        caches.append(payload["report"]["cache"])
    assert caches[1] == "hit"
    rejected = cli.invoke(main, ["export", "tight-export.toml", *MODEL, "-o", "t.pt2"])
    assert rejected.exit_code == 1, rejected.output
    assert re.fullmatch(
        rf"MISMATCH: tight-export on planted_gelu:mlp: the exported program t.pt2 vs eager: outputs max \|diff\| {DIFF} "
        r"\(rtol 0.001, atol 0.0001\); first mismatch: output\[0\]: max \|diff\| \S+", rejected.stdout.splitlines()[-1])
