"""Hugging Face models at their default settings train and infer through passkit as in eager.

Each model (random init, small sizes, every other setting the config's default, so attention
is SDPA and dropout is on) takes one training step whose loss and every gradient equal eager's,
and one inference call under ``eval()`` and ``no_grad()``, through ``training-python``; GPT-2
also through the default ``training`` (Inductor's kernels). Two of them also run four batch
sizes through the plain ``torch.compile(backend="passkit")``: one static compile, one symbolic,
then reuse.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import passkit

sys.path.insert(0, str(Path(__file__).parent))
from zoo import ZOO, ZooModel  # noqa: E402

pytestmark = pytest.mark.slow

BY_NAME = {model.name: model for model in ZOO}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def _assert_compiled(reports: list) -> None:
    assert reports, "passkit compiled nothing"
    for report in reports:
        ran = [r.id for r in report.records if r.status == "ran"]
        assert ran[-1].startswith("codegen."), f"{report.graph}: {ran}"
        # No model at its defaults needs the captured graph differentiated: every step shapes its joint.
        kept = [r.stats["differentiated"] for r in report.records if "differentiated" in r.stats]
        assert not kept, f"{report.graph}: {kept}"


def _output(out: object) -> torch.Tensor:
    return out.logits  # type: ignore[attr-defined]


def _train_and_infer_like_eager(zoo: ZooModel, pipeline: str, *, infer: bool = True, **tolerance: float) -> list:
    torch.manual_seed(0)
    eager = zoo.build()
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline=pipeline)
    torch.manual_seed(1)
    inputs = zoo.inputs(2)
    torch.manual_seed(2)  # the same dropout masks
    expected = eager(**inputs).loss
    expected.backward()
    torch.manual_seed(2)
    actual = compiled(**inputs).loss
    actual.backward()
    torch.testing.assert_close(actual, expected, **tolerance)
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        if p.grad is None:
            assert q.grad is None, name
            continue
        torch.testing.assert_close(q.grad, p.grad, **tolerance, msg=lambda m: f"grad {name}: {m}")
    if not infer:
        _assert_compiled(compiled.passkit_reports)
        return compiled.passkit_reports
    eager.eval()
    twin.eval()
    with torch.no_grad():
        torch.testing.assert_close(_output(compiled(**inputs)), _output(eager(**inputs)), **tolerance)
    _assert_compiled(compiled.passkit_reports)
    kinds = {report.graph.split(", ")[1] for report in compiled.passkit_reports}
    assert kinds == {"training", "inference"}
    return compiled.passkit_reports


@pytest.mark.parametrize("zoo", ZOO, ids=lambda z: z.name)
def test_training_step_and_inference_match_eager(zoo: ZooModel) -> None:
    _train_and_infer_like_eager(zoo, "training-python", rtol=1e-5, atol=1e-6)


# The shipped `training` pipeline (Inductor's fused kernels) on the zoo's GPT-2: SDPA, dropout,
# tied embeddings, a graph break, training and inference graphs. Every model costs a minute of
# C++ compiling here, so GPT-2 and BERT (below) stand for the zoo in CI; benchmarks/model_zoo.py
# runs them all.
# `training` draws random numbers with ATen's generator (`fallback_random`), so dropout draws
# eager's masks and the gradients compare at float tolerance.
def test_the_default_inductor_pipeline_trains_and_infers_like_eager() -> None:
    reports = _train_and_infer_like_eager(BY_NAME["gpt2"], "training", rtol=1e-4, atol=1e-5)
    assert {report.records[-1].pass_name for report in reports} == {"codegen.inductor"}


# BERT at its defaults (padded attention mask, dropout after every layer norm) through Inductor:
# its loss was NaN while Inductor ordered the dropout fill after the kernel that read it
# (`_torch.hide_bernoulli_fills`). Training only: its inference graph never had the fault, and
# compiling it too doubles the test's C++ compiling (76 s from cold caches).
def test_bert_trains_through_the_default_inductor_pipeline() -> None:
    reports = _train_and_infer_like_eager(BY_NAME["bert"], "training", infer=False, rtol=1e-4, atol=1e-5)
    assert {report.records[-1].pass_name for report in reports} == {"codegen.inductor"}


@pytest.mark.parametrize("name", ["llama", "vit"])
def test_four_batch_sizes_through_plain_torch_compile_compile_twice(name: str) -> None:
    zoo = BY_NAME[name]
    torch.manual_seed(0)
    eager = zoo.build().eval()  # no dropout: each batch compares exactly
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, backend="passkit")
    start = len(passkit.reports())
    counts = []
    for batch in (2, 3, 4, 5):
        torch.manual_seed(batch)
        inputs = zoo.inputs(batch)
        expected, actual = eager(**inputs).loss, compiled(**inputs).loss
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        actual.backward()
        expected.backward()
        for (pname, p), q in zip(eager.named_parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"batch {batch} grad {pname}: {m}")
            p.grad = q.grad = None
        counts.append(len(passkit.reports()) - start)
    first = counts[0]
    assert first >= 1
    assert counts == [first, 2 * first, 2 * first, 2 * first]  # static, symbolic, then reuse
    _assert_compiled(passkit.reports()[start:])
