"""Own ``passkit run``'s job: compile a model, run one step, and compare it with eager.

The step is a training step (forward, a loss, backward) when the pipeline can train and the
model has parameters that require grad; otherwise it is an inference step under ``no_grad``.
Outputs, gradients and buffers are compared with an eager copy of the same model, within the
pipeline's ``rtol``/``atol`` loosened by the tolerance declared by the steps that ran on any
graph (``compare.tolerance_for``, the rule ``verify`` and ``bisect`` use); eager's step and the
compiled step each draw random numbers from the one seed (``compare.same_random_draws``). A compile that fell back to eager (``on_error = "eager"``) is
recorded in ``fallbacks`` rather than warned about: the caller reports it.

The result carries the run's ``Verdict`` (``passkit.core.report``): ok or mismatch (or fell back), the
max |diff| of each output, gradient and buffer, the tolerance and the exit code. It is attached
to every report (so ``Report.table()`` ends with it) and written into the HTML report; a step
that fails writes a "step failed" verdict there before its error propagates.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from passkit._torch import pytree
from passkit.verify.compare import compare_values, same_random_draws, tolerance_for
from passkit.errors import EXIT_FELL_BACK, EXIT_MISMATCH, EXIT_OK, PasskitError, exit_code_for
from passkit.core.report import Report, StepRecord, ValueDiff, Verdict

__all__ = ["CheckResult", "ModelExample", "run_check", "load_factory", "build_model", "DEFAULT_MODEL"]

DEFAULT_MODEL = "passkit.examples.transformer:block"


@dataclass
class CheckResult:
    pipeline: str
    model: str
    training: bool
    reports: list[Report]
    outputs_max_diff: float
    grads_max_diff: float | None
    buffers_max_diff: float | None = None
    ok: bool = True
    mismatches: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    rtol: float = 0.0
    atol: float = 0.0
    verdict: Verdict | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "model": self.model,
            "training": self.training,
            "ok": self.ok,
            "outputs_max_diff": self.outputs_max_diff,
            "grads_max_diff": self.grads_max_diff,
            "buffers_max_diff": self.buffers_max_diff,
            "mismatches": self.mismatches,
            "fallbacks": self.fallbacks,
            "rtol": self.rtol,
            "atol": self.atol,
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "reports": [r.to_json() for r in self.reports],
        }


def load_factory(spec: str) -> Callable[[], Any]:
    """``"pkg.mod:factory"`` → the factory; errors are one line."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PasskitError(f"--model must look like 'package.module:factory', not '{spec}'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: models in the current folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PasskitError(f"--model {spec}: cannot import '{module_name}': {exc}") from exc
    except Exception as exc:  # the user's module raised as it ran: their code, so bad input
        raise PasskitError(f"--model {spec}: importing '{module_name}' raised {_one_line(exc)}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PasskitError(f"--model {spec}: '{module_name}' has no callable '{attr}'")
    return factory


@dataclass(frozen=True)
class ModelExample:
    """What a ``--model`` factory made: the module and the example call's arguments.

    The one factory contract of ``passkit run``, ``bisect`` and ``export``: the factory returns
    ``(module, example_inputs)``, where ``example_inputs`` is a tuple or list of positional
    arguments, a lone tensor, or a lone dict of keyword arguments (a Hugging Face model's
    ``{"input_ids": ...}``), alone or as the tuple's only item.
    """

    module: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def fresh(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments again, each tensor cloned, so one call cannot change another's inputs."""
        def clone(value: Any) -> Any:
            return value.clone() if isinstance(value, torch.Tensor) else value

        return tuple(clone(a) for a in self.args), {k: clone(v) for k, v in self.kwargs.items()}

    def __call__(self, module: Any = None) -> Any:
        """``module`` (default: the factory's) called on fresh arguments."""
        args, kwargs = self.fresh()
        return (self.module if module is None else module)(*args, **kwargs)


def build_model(spec: str) -> ModelExample:
    """Call the ``--model`` factory (``ModelExample`` says what it must return). The factory is
    the user's code: an exception from it is bad input (one line naming it), not passkit's bug."""
    factory = load_factory(spec)
    try:
        made = factory()
    except Exception as exc:
        raise PasskitError(f"--model {spec}: the factory raised {_one_line(exc)}") from exc
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        raise PasskitError(f"--model {spec}: the factory must return (module, example_inputs)")
    module, inputs = made
    if isinstance(inputs, dict):
        return ModelExample(module, (), dict(inputs))
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if len(inputs) == 1 and isinstance(inputs[0], dict):
        return ModelExample(module, (), dict(inputs[0]))
    return ModelExample(module, inputs, {})


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _loss(out: Any) -> torch.Tensor:
    """A loss whose gradient into each floating output is the seeded cotangent ``verify`` sends
    there, so ``run`` compares the gradients ``verify`` and bisect compare (a mean would scale
    every gradient difference down by the output's size)."""
    from passkit.verify.evaluate import output_cotangent

    leaves = [(j, t) for j, t in enumerate(pytree.tree_leaves(out)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(((t * output_cotangent(t.detach(), j)).float().sum() for j, t in leaves), torch.zeros(()))


def run_check(
    pipeline: Any,
    *,
    model: str | None = None,
    dump_dir: str | None = None,
    progress: Callable[[StepRecord], None] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> CheckResult:
    """Compile ``model`` (default: the shipped transformer block) with ``pipeline``; one step vs eager.

    ``rtol``/``atol`` override the pipeline's settings. A ``progress`` object with a ``begin``
    method gets the resolved pipeline once the model is built, before anything is compiled.
    """
    import passkit
    from passkit.frontends.api import load_pipeline

    spec = model or DEFAULT_MODEL
    resolved = load_pipeline(pipeline).with_settings(rtol=rtol, atol=atol)
    # The model first: a bad --model is one line on its own, not under the table's header.
    example = build_model(spec)
    eager_model = example.module
    begin = getattr(progress, "begin", None)
    if callable(begin):
        begin(resolved)
    if dump_dir is not None:
        resolved = resolved.with_settings(dump_dir=dump_dir, dump="all" if resolved.settings.dump == "off" else resolved.settings.dump)
    compiled_model = copy.deepcopy(eager_model)
    training = resolved.can_train and any(p.requires_grad for p in eager_model.parameters())
    compiled = passkit.compile(compiled_model, pipeline=resolved, progress=progress)
    # Eager and the compiled step each draw from the one seed (dropout gets the same mask on both).
    with torch.set_grad_enabled(training), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="passkit: compiling failed", category=RuntimeWarning)
        with same_random_draws():
            expected = example(eager_model)
            if training:
                _loss(expected).backward()
        try:
            with same_random_draws():
                actual = example(compiled)
                if training:
                    _loss(actual).backward()
        except PasskitError as exc:
            _write_html_verdict(resolved, Verdict("step failed", exit_code_for(exc), detail=str(exc).splitlines()[0]))
            raise
    mismatches: list[str] = []
    values: list[ValueDiff] = []
    reports = list(compiled.passkit_reports)
    ran = {record.position for report in reports for record in report.records if record.status == "ran"}
    rtol, atol = tolerance = tolerance_for(resolved.settings, (step for step in resolved.steps if step.position in ran))

    def compared(expected_values: list[Any], actual_values: list[Any], label: str, names: list[str]) -> float:
        comparison = compare_values(expected_values, actual_values, label, tolerance, names=names)
        mismatches.extend(str(m) for m in comparison.mismatches)
        bad = {m.index for m in comparison.mismatches}
        values.extend(ValueDiff(f"{label}[{name}]", diff, name not in bad) for name, diff in zip(names, comparison.diffs))
        return comparison.max_diff

    flat = pytree.tree_leaves
    expected_leaves, actual_leaves = flat(expected), flat(actual)
    outputs_diff = compared(expected_leaves, actual_leaves, "output", [str(i) for i in range(len(expected_leaves))])
    grads_diff = None
    if training:
        named = list(eager_model.named_parameters())
        grads_diff = compared([p.grad for _, p in named], [p.grad for p in compiled_model.parameters()], "grad", [n for n, _ in named])
    buffers = list(eager_model.named_buffers())
    buffers_diff = None
    if buffers:
        buffers_diff = compared([b for _, b in buffers], list(compiled_model.buffers()), "buffer", [n for n, _ in buffers])
    fallbacks = list(getattr(compiled, "passkit_fallbacks", []))
    verdict = _verdict(mismatches, fallbacks, values, tolerance)
    # Copies: the compiled model's own reports (perhaps the compile cache's) stay as compiled.
    reports = [dataclasses.replace(report, verdict=verdict) for report in reports]
    _write_html_verdict(resolved, verdict)
    return CheckResult(
        pipeline=str(resolved.source or resolved.name),
        model=spec,
        training=training,
        reports=reports,
        outputs_max_diff=outputs_diff,
        grads_max_diff=grads_diff,
        buffers_max_diff=buffers_diff,
        ok=not mismatches,
        mismatches=mismatches,
        fallbacks=fallbacks,
        rtol=rtol,
        atol=atol,
        verdict=verdict,
    )


def _verdict(mismatches: list[str], fallbacks: list[str], values: list[ValueDiff], tolerance: Any) -> Verdict:
    rtol, atol = tolerance
    if fallbacks:
        return Verdict("fell back to eager", EXIT_FELL_BACK, rtol, atol, values, f"the compile failed: {fallbacks[0]}")
    if mismatches:
        return Verdict("mismatch", EXIT_MISMATCH, rtol, atol, values, f"first mismatch: {mismatches[0]}")
    return Verdict("ok", EXIT_OK, rtol, atol, values)


def _write_html_verdict(pipeline: Any, verdict: Verdict) -> None:
    """Put the verdict at the top of the HTML report, when the run writes one."""
    if pipeline.settings.report:
        from passkit.instruments.html_report import write_verdict

        write_verdict(pipeline.settings.report, verdict)
