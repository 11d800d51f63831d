"""Fact contracts of training and inference plans, and how fast loading is."""

from __future__ import annotations

import time

import pytest

from passkit.errors import PipelineError
from passkit.pipeline import check_contracts, load_pipeline


def test_a_training_pipeline_also_passes_its_inference_plan(base, registry):
    pipeline = load_pipeline("base.toml", registry=registry)
    assert pipeline.can_train
    # Neither plan raises: the inference one skips joint and partition.
    assert check_contracts(pipeline, registry, training=True) is None
    assert check_contracts(pipeline, registry, training=False) is None


def test_inference_plan_names_the_training_only_producer(write, registry):
    write(
        "x.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'joint'\n"
        "[[steps]]\npass = 'partition.default'\n[[steps]]\npass = 'acme.after_partition'\n"
        "[[steps]]\npass = 'codegen.python'\n",
    )
    pipeline = load_pipeline("x.toml", registry=registry)  # the training plan is fine
    with pytest.raises(PipelineError) as info:
        check_contracts(pipeline, registry, training=False)
    assert str(info.value) == (
        "x.toml: steps[3] (acme.after_partition): requires fact 'partitioned', which no earlier step produces "
        "for inference (step 'partition.default' runs only for training); set when = \"training\" on this step"
    )


def test_when_training_steps_are_skipped_for_inference(write, registry):
    write(
        "x.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'joint'\n"
        "[[steps]]\npass = 'partition.default'\n[[steps]]\npass = 'acme.after_partition'\nwhen = 'training'\n"
        "[[steps]]\npass = 'codegen.python'\n",
    )
    pipeline = load_pipeline("x.toml", registry=registry)
    assert pipeline.step("acme.after_partition").when == "training"
    assert check_contracts(pipeline, registry, training=False) is None  # the step is skipped


def test_when_inference_steps_are_skipped_for_training(write, registry):
    write(
        "x.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'joint'\n"
        "[[steps]]\npass = 'partition.default'\n[[steps]]\npass = 'codegen.python'\nwhen = 'inference'\n",
    )
    with pytest.raises(PipelineError) as info:
        load_pipeline("x.toml", registry=registry)
    assert str(info.value) == (
        "x.toml: no step produces fact 'compiled' (step 'codegen.python' has when = \"inference\")"
    )


def test_inference_plan_of_a_training_pipeline_says_so(write, registry):
    write(
        "x.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'joint'\n"
        "[[steps]]\npass = 'partition.default'\n[[steps]]\npass = 'codegen.python'\nwhen = 'training'\n",
    )
    pipeline = load_pipeline("x.toml", registry=registry)
    with pytest.raises(PipelineError) as info:
        check_contracts(pipeline, registry, training=False)
    assert str(info.value) == (
        "x.toml: no step produces fact 'compiled' for inference (step 'codegen.python' has when = \"training\")"
    )


def test_a_pipeline_without_joint_is_checked_as_inference(write, registry):
    # partition would need 'joint'; inference plans skip training-only passes, so this loads.
    write(
        "x.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'partition.default'\n"
        "[[steps]]\npass = 'codegen.python'\n",
    )
    assert not load_pipeline("x.toml", registry=registry).can_train


def test_a_producer_restores_an_invalidated_fact(write, registry):
    write(
        "x.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'joint'\n"
        "[[steps]]\npass = 'partition.default'\n[[steps]]\npass = 'joint'\nid = 'joint.again'\n"
        "[[steps]]\npass = 'partition.torch_min_cut'\n[[steps]]\npass = 'codegen.python'\n",
    )
    pipeline = load_pipeline("x.toml", registry=registry)  # would raise if 'joint' stayed invalidated
    assert [s.id for s in pipeline.steps][3:5] == ["joint.again", "partition.torch_min_cut"]


def test_loading_a_50_step_pipeline_is_fast(write, registry):
    lines = [
        "[settings]\nverify = 'facts'\n",
        "[[steps]]\npass = 'functionalize'\n",
        "[[steps]]\npass = 'joint'\n",
        "[[steps]]\npass = 'partition.torch_min_cut'\nmemory_budget = 0.5\n",
    ]
    for index in range(46):
        lines.append(f"[[steps]]\npass = 'decompose'\nid = 'd{index}'\ntables = ['core_aten']\nkeep = ['x']\n")
    lines.append("[[steps]]\npass = 'codegen.python'\n")
    write("big.toml", "".join(lines))
    assert len(load_pipeline("big.toml", registry=registry).steps) == 50
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        load_pipeline("big.toml", registry=registry)
        best = min(best, time.perf_counter() - started)
    assert best < 0.05, f"loading 50 steps took {best * 1000:.1f} ms"


def test_a_plugins_own_joint_pass_makes_a_pipeline_trainable(tmp_path) -> None:
    import types

    import passkit
    from passkit.pipeline import load_pipeline
    from passkit.core.plugins import make_plugin_manager
    from passkit.core.registry import build_registry

    @passkit.graph_pass("acme.joint", requires={"functional"}, produces={"joint"}, training_only=True)
    def acme_joint(program) -> bool:
        """A team's own joint graph builder."""
        return False

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(types.SimpleNamespace(passkit_register_passes=passkit.hookimpl(lambda: [acme_joint])), name="acme")
    registry = build_registry(pm)
    path = tmp_path / "acme.toml"
    path.write_text(
        '[pipeline]\nextends = "training-python"\ndisable = ["joint"]\n\n'
        '[[steps]]\npass = "acme.joint"\nafter = "joint"\n'
    )
    pipeline = load_pipeline(str(path), registry=registry)
    assert pipeline.can_train
    enabled = [s.pass_name for s in pipeline.steps if s.enabled]
    assert "acme.joint" in enabled and "joint" not in enabled
