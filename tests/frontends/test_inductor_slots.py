"""Pipeline files mounted in stock Inductor's custom-pass slots (``passkit.inductor_options``).

What a user sees: which config entries a file fills, the one-line refusals at load, the same
numerics as eager, one report row per step and graph, ``verify``/``dump`` inside a slot, the
example plugin's rewrite in Inductor's output code, identical code for an empty file, and
Inductor's own FX graph cache hitting and missing across processes as the file changes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, CustomPartitionerFn
from torch._inductor.utils import run_and_get_code

import passkit
from dependencies import require_module

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "inductor_slots_child.py"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3)), torch.randn(5, 6)


def train_step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = model(x)
    out.sum().backward()
    return out.detach(), [p.grad for p in model.parameters()]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# Loading: slots, refusals, overlays


def test_each_slot_with_steps_gets_one_cacheable_object_and_nothing_else(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.toml", """
        [[steps]]
        pass = "fx.dce"
        slot = "joint_post"

        [[steps]]
        pass = "partition.min_cut"

        [[steps]]
        pass = "fx.cse"
        slot = "post_grad_pre"

        [[steps]]
        pass = "fx.dce"
        id = "dce.2"
        slot = "post_grad_pre"
    """)
    options = passkit.inductor_options(path)
    assert sorted(options) == ["custom_partitioner_fn", "joint_custom_post_pass", "post_grad_custom_pre_pass"]
    assert isinstance(options["custom_partitioner_fn"], CustomPartitionerFn)
    assert all(isinstance(options[k], CustomGraphPass) for k in ("joint_custom_post_pass", "post_grad_custom_pre_pass"))
    uuids = {key: value.uuid() for key, value in options.items()}
    assert len(set(uuids.values())) == 3
    assert {key: value.uuid() for key, value in passkit.inductor_options(path).items()} == uuids
    explained = {step["id"]: step.get("slot") for step in passkit.load_pipeline(path).explain()["steps"]}
    assert explained == {
        "fx.dce": {"value": "joint_post", "from": str(path)},
        "partition.min_cut": {"value": "partition", "from": "<inferred>"},
        "fx.cse": {"value": "post_grad_pre", "from": str(path)},
        "dce.2": {"value": "post_grad_pre", "from": str(path)},
    }


def test_an_empty_file_or_disabled_steps_fill_no_slot(tmp_path: Path) -> None:
    assert passkit.inductor_options(write(tmp_path, "empty.toml", "[pipeline]\nname = 'nothing'\n")) == {}
    disabled = write(tmp_path, "off.toml", '[[steps]]\npass = "fx.dce"\nslot = "post_grad_post"\nenabled = false\n')
    assert passkit.inductor_options(disabled) == {}


REFUSALS = {
    "codegen": ('pass = "codegen.python"\nslot = "post_grad_post"',
                "steps[0] (codegen.python).slot: 'codegen.python' generates code, which Inductor does for a mounted "
                "file; remove the step"),
    "missing fact": ('pass = "rewrite"\npatterns = ["noops"]\nslot = "pre_grad"',
                     "steps[0] (rewrite).slot: requires fact 'functional', which the graph in slot 'pre_grad' lacks "
                     "(it holds: captured); slots whose graph holds it: joint_pre, joint_post, post_grad_pre, "
                     "post_grad_post"),
    "new inputs": ('pass = "joint"\nslot = "post_grad_pre"',
                   "steps[0] (joint).slot: 'joint' produces 'joint', which adds or removes graph inputs or outputs, "
                   "and Inductor forbids that in slot 'post_grad_pre'"),
    "partitioner elsewhere": ('pass = "partition.min_cut"\nslot = "joint_post"',
                              "steps[0] (partition.min_cut).slot: 'partition.min_cut' produces 'partitioned', which "
                              "adds or removes graph inputs or outputs, and Inductor forbids that in slot "
                              "'joint_post'; a partitioner goes in slot 'partition'"),
    "breaks a fact": ('pass = "reinplace"\nslot = "post_grad_post"',
                      "steps[0] (reinplace).slot: 'reinplace' invalidates 'functional', which Inductor's own passes "
                      "after slot 'post_grad_post' rely on; Inductor does that work itself, so leave the step out"),
    "not a partitioner": ('pass = "fx.dce"\nslot = "partition"',
                          "steps[0] (fx.dce).slot: slot 'partition' takes a partitioner (a pass that produces "
                          "'partitioned'), and 'fx.dce' is not one; run it in 'joint_post' or 'post_grad_pre'"),
    "no slot": ('pass = "fx.dce"',
                "steps[0] (fx.dce): no slot; a mounted file runs each step in one of Inductor's slots: set slot = "
                "one of 'pre_grad', 'joint_pre', 'joint_post', 'partition', 'post_grad_pre', 'post_grad_post'"),
    "unknown slot": ('pass = "fx.dce"\nslot = "post_grad"',
                     "steps[0] (fx.dce).slot: Input should be 'pre_grad', 'joint_pre', 'joint_post', 'partition', "
                     "'post_grad_pre' or 'post_grad_post'"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_step_that_cannot_run_in_its_slot_is_refused_at_load_in_one_line(tmp_path: Path, case: str) -> None:
    body, message = REFUSALS[case]
    path = write(tmp_path, "bad.toml", f"[[steps]]\n{body}\n")
    with pytest.raises(passkit.PipelineError) as info:
        passkit.inductor_options(path)
    assert str(info.value) == f"{path}: {message}"


def test_two_partitioners_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "two.toml", """
        [[steps]]
        pass = "partition.min_cut"

        [[steps]]
        pass = "partition.default"
    """)
    with pytest.raises(passkit.PipelineError) as info:
        passkit.inductor_options(path)
    assert str(info.value) == (
        f"{path}: steps[1] (partition.default).slot: slot 'partition' already holds step 'partition.min_cut'; "
        "Inductor takes one partitioner"
    )


def test_extends_override_and_disable_work_on_a_mounted_file(tmp_path: Path) -> None:
    write(tmp_path, "base.toml", """
        [[steps]]
        pass = "partition.min_cut"

        [[steps]]
        id = "gemm"
        pass = "rewrite"
        patterns = ["gemm"]
        slot = "post_grad_pre"
    """)
    overlay = write(tmp_path, "mine.toml", """
        [pipeline]
        extends = "base.toml"
        disable = ["gemm"]

        [override."partition.min_cut"]
        memory_budget = 0.5

        [[steps]]
        pass = "fx.cse"
        slot = "joint_pre"
    """)
    base_options = passkit.inductor_options(tmp_path / "base.toml")
    options = passkit.inductor_options(overlay)
    assert sorted(options) == ["custom_partitioner_fn", "joint_custom_pre_pass"]
    # One changed option changes the partitioner's cache key.
    assert options["custom_partitioner_fn"].uuid() != base_options["custom_partitioner_fn"].uuid()


def test_validate_and_explain_accept_a_mounted_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from passkit.cli import main

    done = CliRunner().invoke(main, ["validate", "inductor-post-grad"])
    assert done.exit_code == 0, done.output
    assert done.output.startswith("ok  ")
    explained = CliRunner().invoke(main, ["explain", "inductor-post-grad"])
    # The file that set the slot is the step's own: named once, in the set-by column.
    assert re.search(r"^1  partition\.min_cut \[slot partition\]\s+-\s+\S*inductor-post-grad\.toml$",
                     explained.output, re.MULTILINE), explained.output


# ---------------------------------------------------------------------------------------------
# Running inside torch.compile


class GatedMLP(torch.nn.Module):
    """Two projections of one input (gate and up, as in Llama): what the ``gemm`` set merges."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = torch.nn.Linear(6, 8), torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.slow
def test_the_shipped_file_trains_like_eager_and_reports_each_step_per_graph() -> None:
    torch.manual_seed(0)
    model, x = GatedMLP(), torch.randn(5, 6)
    eager = copy.deepcopy(model)
    seen = len(passkit.reports())
    out, grads = train_step(torch.compile(model, options=passkit.inductor_options("inductor-post-grad")), x)
    expected, expected_grads = train_step(eager, x)
    torch.testing.assert_close(out, expected)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want)
    reports = passkit.reports()[seen:]
    rows = [(r.graph, record.id, record.status) for r in reports for record in r.records]
    assert rows == [
        ("slot partition, joint", "partition.min_cut", "ran"),
        ("slot post_grad_pre, forward", "fx.cse", "ran"),
        ("slot post_grad_pre, forward", "gemm", "ran"),
        ("slot post_grad_pre, backward", "fx.cse", "ran"),
        ("slot post_grad_pre, backward", "gemm", "ran"),
    ]
    partition = reports[0].records[0]
    assert partition.stats["saved"] > 0 and partition.stats["saved_bytes"] > 0
    forward_gemm = reports[1].records[1]
    assert forward_gemm.changed and any(name.startswith("gemm:") for name in forward_gemm.stats["applied"])


@pytest.mark.slow
def test_verify_facts_names_the_slot_step_that_broke_a_fact(tmp_path: Path, register_passkit_plugin) -> None:
    @passkit.graph_pass("test.sneaky_inplace", requires={"functional"})
    def sneaky_inplace(program: passkit.Program) -> bool:
        """Turn the first relu into relu_ (breaks 'functional')."""
        for gm in program.graphs.values():
            for node in gm.graph.nodes:
                if node.target is torch.ops.aten.relu.default:
                    node.target = torch.ops.aten.relu_.default
                    gm.recompile()
                    return True
        return False

    class Plugin:
        @passkit.hookimpl
        def passkit_register_passes(self):
            return [sneaky_inplace]

    register_passkit_plugin(Plugin(), name="test-sneaky")
    path = write(tmp_path, "sneaky.toml", """
        [settings]
        verify = "facts"

        [[steps]]
        pass = "test.sneaky_inplace"
        slot = "post_grad_pre"
    """)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with torch.no_grad(), pytest.raises(Exception) as info:
        torch.compile(model, options=passkit.inductor_options(path))(torch.randn(2, 4))
    assert (f"{path}: steps[0] (test.sneaky_inplace) broke fact 'functional': mutating ops remain: "
            "main:relu (aten.relu_.default)") in str(info.value)


@pytest.mark.slow
def test_dump_writes_every_graph_each_slot_saw(tmp_path: Path) -> None:
    path = write(tmp_path, "dumped.toml", """
        [[steps]]
        pass = "fx.dce"
        slot = "joint_pre"

        [[steps]]
        pass = "partition.min_cut"

        [[steps]]
        pass = "fx.cse"
        slot = "post_grad_post"
    """)
    model, x = mlp()
    dump_dir = tmp_path / "dump"
    compiled = torch.compile(model, options=passkit.inductor_options(path, dump="all", dump_dir=str(dump_dir)))
    train_step(compiled, x)
    files = sorted(p.name for p in dump_dir.rglob("*.py") if not p.name.startswith("00-"))
    assert files == [
        "01-fx.dce-joint.py", "02-partition.min_cut-backward.py", "02-partition.min_cut-forward.py",
        "03-fx.cse-backward.py", "03-fx.cse-forward.py",
    ]


def _inference_code(model: torch.nn.Module, x: torch.Tensor, **compile_kwargs) -> tuple[torch.Tensor, str]:
    torch._dynamo.reset()
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(model, **compile_kwargs), x)
    # The first line numbers AOT Autograd's compiles in this process.
    return out, "\n".join(line for text in code for line in text.splitlines() if not line.startswith("# AOT ID:"))


@pytest.mark.slow
def test_an_empty_file_leaves_inductors_code_identical(tmp_path: Path) -> None:
    model, x = mlp()
    _, plain = _inference_code(model, x)
    _, mounted = _inference_code(model, x, options=passkit.inductor_options(write(tmp_path, "e.toml", "")))
    assert mounted == plain


@pytest.mark.slow
def test_with_max_autotune_an_empty_file_leaves_the_code_identical_and_the_shipped_file_trains_like_eager(
    tmp_path: Path,
) -> None:
    # torch.compile takes a mode or options, not both: the slots are mounted through Inductor's
    # config, as a user combining them would.
    from torch._inductor import config as inductor_config

    model, x = mlp()
    mode = "max-autotune-no-cudagraphs"
    _, plain = _inference_code(model, x, mode=mode)
    with inductor_config.patch(passkit.inductor_options(write(tmp_path, "e.toml", ""))):
        _, mounted = _inference_code(model, x, mode=mode)
    assert mounted == plain
    eager = copy.deepcopy(model)
    expected = train_step(eager, x)
    torch._dynamo.reset()
    with inductor_config.patch(passkit.inductor_options("inductor-post-grad")):
        got = train_step(torch.compile(model, mode=mode), x)
    torch.testing.assert_close(got[0], expected[0])
    for actual, wanted in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(actual, wanted)


@pytest.mark.slow
def test_the_example_plugins_gelu_tanh_rewrite_is_in_inductors_output_code(tmp_path: Path) -> None:
    require_module("passkit_example", "pip install -e plugins/passkit-example")
    path = write(tmp_path, "gelu.toml", """
        [[steps]]
        id = "gelu_tanh"
        pass = "rewrite"
        patterns = ["example:gelu_tanh"]
        expect_match = true
        slot = "post_grad_pre"
    """)
    model, x = mlp()
    expected, plain = _inference_code(model, x)
    out, mounted = _inference_code(model, x, options=passkit.inductor_options(path))
    def calls(op: str, code: str) -> bool:
        return re.search(rf"\b{op}\b", code) is not None

    assert not calls("tanh", plain) and calls("erf", plain)
    assert calls("tanh", mounted) and not calls("erf", mounted)
    torch.testing.assert_close(out, torch.nn.functional.gelu(model[0](x), approximate="tanh") @ model[2].weight.T
                               + model[2].bias)
    assert (out - expected).abs().max() > 0  # the approximation, not the exact GELU


@pytest.mark.slow
def test_with_dynamic_shapes_the_mounted_file_trains_like_eager_at_two_sizes() -> None:
    model, _ = mlp()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, options=passkit.inductor_options("inductor-post-grad"), dynamic=True)
    for rows in (3, 7):
        x = torch.randn(rows, 6)
        out, grads = train_step(compiled, x)
        expected, expected_grads = train_step(eager, x)
        torch.testing.assert_close(out, expected)
        for grad, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, want)
        model.zero_grad()
        eager.zero_grad()


# ---------------------------------------------------------------------------------------------
# Inductor's FX graph cache, across processes


PLUGIN_SOURCE = '''
import passkit


@passkit.graph_pass("acme.slot_noop", requires={"functional"})
def slot_noop(program: passkit.Program) -> bool:
    """Change nothing (version %d)."""
    return False


@passkit.hookimpl
def passkit_register_passes():
    return [slot_noop]
'''


def _child(tmp_path: Path, *files: Path) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(tmp_path), env.get("PYTHONPATH", "")]))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")
    env["SLOTS_CHILD_PLUGIN"] = "acme_slot_plugin"
    done = subprocess.run([sys.executable, str(CHILD), *map(str, files)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_inductors_fx_graph_cache_hits_across_processes_and_misses_when_the_file_or_a_plugin_changes(
    tmp_path: Path,
) -> None:
    plugin = tmp_path / "acme_slot_plugin.py"
    plugin.write_text(PLUGIN_SOURCE % 1)
    steps = """
        [[steps]]
        pass = "partition.min_cut"
        memory_budget = %s

        [[steps]]
        pass = "acme.slot_noop"
        slot = "post_grad_pre"
    """
    first = write(tmp_path, "first.toml", steps % "1.0")
    changed = write(tmp_path, "changed.toml", steps % "0.5")

    (cold,) = _child(tmp_path, first)
    again, option_changed = _child(tmp_path, first, changed)
    plugin.write_text(PLUGIN_SOURCE % 2)
    (plugin_edited,) = _child(tmp_path, first)

    counts = [(r["file"], r["hit"], r["miss"]) for r in (cold, again, option_changed, plugin_edited)]
    print("fx graph cache (file, hit, miss):", counts)
    assert counts == [("first.toml", 0, 2), ("first.toml", 2, 0), ("changed.toml", 0, 2), ("first.toml", 0, 2)]
    assert all(r["difference"] < 1e-5 for r in (cold, again, option_changed, plugin_edited))


def test_a_mounted_file_given_to_the_passkit_backend_says_how_to_mount_it() -> None:
    with pytest.raises(passkit.PasskitError) as info:
        passkit.compile(torch.nn.Linear(2, 2), pipeline="inductor-post-grad")
    label = passkit.load_pipeline("inductor-post-grad").label
    assert str(info.value) == (
        f"{label}: the file mounts its steps in Inductor's slots; "
        "use torch.compile(model, options=passkit.inductor_options('inductor-post-grad'))"
    )
