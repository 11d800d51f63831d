"""Own judging one fuzz program: eager, the pipeline, and torch's own path when they disagree.

Each side gets a fresh copy of the module and of the inputs, and calls inside the one rule for
random ops (``passkit.verify.compare.same_random_draws``), so random ops draw alike. What is
compared is what a user can observe:

- the outputs, and which inputs each output shares storage with (an output that aliases an
  input in eager must alias it compiled, and no other);
- each output's ``requires_grad``;
- the inputs' and buffers' values afterwards (mutations, BatchNorm's running statistics);
- in training, the gradients of the inputs and parameters, from the seeded cotangent
  ``passkit.verify.evaluate.output_cotangent`` sends into each output (the one ``verify``,
  ``passkit run`` and bisect send).

Values are held to the one tolerance rule (``passkit.verify.compare``). A program eager itself
refuses is ``invalid``. When the pipeline raises or differs, the same program goes through
torch's own path (``torch.compile(backend="aot_eager")``; for export, ``torch.export`` and
``run_decompositions``): if torch fails or differs too, the program is ``skipped``, else it is a
``difference``. For a pipeline that generates code with Inductor (``codegen.inductor``), torch's
path is ``torch.compile``'s Inductor, with the step's ``fallback_random``: its fused kernels sum
in other orders than ATen's (a gradient that is zero up to rounding, amplified by a BatchNorm
over equal rows, is not zero the same way), and drawing its own way it cannot draw eager's
random numbers either.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from passkit.fuzz.program import FuzzProgram
from passkit.verify.compare import Tolerance, compare_values, same_random_draws

__all__ = ["Observed", "Verdict", "judge", "compile_with", "torch_path", "torch_path_for", "observe", "differences",
           "one_line"]

Compiler = Callable[[FuzzProgram, torch.nn.Module, tuple[Any, ...]], Callable[..., Any]]


@dataclass
class Observed:
    """What one call showed."""

    outputs: list[Any]
    aliases: list[frozenset[int]]  # per output: the inputs whose storage it shares
    requires_grad: list[bool]
    grads: list[Any]  # inputs', then parameters'
    finals: list[Any]  # inputs' values afterwards, then buffers'


@dataclass
class Verdict:
    """``ok``, ``invalid`` (eager refuses it), ``skipped`` (torch's path fails or differs too)
    or ``difference``; ``kind`` says what differed first: ``crash``, ``outputs``, ``grads``,
    ``mutations``, ``aliasing``, ``requires_grad``."""

    status: str
    kind: str = ""
    message: str = ""
    torch_message: str = ""
    details: list[str] = field(default_factory=list)

    @property
    def bad(self) -> bool:
        return self.status == "difference"


def _fresh_inputs(inputs: tuple[Any, ...]) -> list[Any]:
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs]


def observe(call: Callable[..., Any], state: torch.nn.Module, inputs: tuple[Any, ...], *, training: bool) -> Observed:
    """Call ``call`` on fresh copies of ``inputs`` (seeded), then backward in training;
    ``state`` is the module whose parameters and buffers the call uses."""
    from passkit.verify.evaluate import output_cotangent

    args = _fresh_inputs(inputs)
    storages = [x.untyped_storage().data_ptr() if isinstance(x, torch.Tensor) else None for x in args]
    with same_random_draws(), torch.set_grad_enabled(training):
        result = call(*args)
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    aliases = [
        frozenset(i for i, s in enumerate(storages) if isinstance(out, torch.Tensor) and s == out.untyped_storage().data_ptr())
        for out in outputs
    ]
    requires_grad = [bool(getattr(out, "requires_grad", False)) for out in outputs]
    if training:
        terms = [(out * output_cotangent(out.detach(), j)).sum() for j, out in enumerate(outputs)
                 if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point()]
        if terms:
            torch.stack(terms).sum().backward()
    params = list(state.parameters())
    return Observed(
        outputs=[out.detach().clone() if isinstance(out, torch.Tensor) else out for out in outputs],
        aliases=aliases,
        requires_grad=requires_grad,
        grads=[x.grad if isinstance(x, torch.Tensor) else None for x in args] + [p.grad for p in params],
        finals=[x.detach() if isinstance(x, torch.Tensor) else x for x in args] + [b.detach() for b in state.buffers()],
    )


def differences(expected: Observed, actual: Observed, tolerance: Tolerance) -> list[tuple[str, str]]:
    """``(kind, message)`` for everything ``actual`` does otherwise than ``expected``."""
    found: list[tuple[str, str]] = []
    for kind, label, e, a in (
        ("outputs", "output", expected.outputs, actual.outputs),
        ("grads", "grad", expected.grads, actual.grads),
        ("mutations", "input after the call", expected.finals, actual.finals),
    ):
        found += [(kind, str(m)) for m in compare_values(e, a, label, tolerance).mismatches]
    for j, (e, a) in enumerate(zip(expected.aliases, actual.aliases)):
        if e != a:
            found.append(("aliasing", f"output[{j}] shares storage with inputs {sorted(e)} in eager, {sorted(a)} compiled"))
    for j, (e, a) in enumerate(zip(expected.requires_grad, actual.requires_grad)):
        if e != a:
            found.append(("requires_grad", f"output[{j}].requires_grad is {e} in eager, {a} compiled"))
    return found


def compile_with(pipeline: Any) -> Compiler:
    """How the pipeline compiles a program: ``passkit.compile`` (Dynamo), or ``passkit.export``
    for an export pipeline, whose program is then called."""
    import passkit

    def compiled(program: FuzzProgram, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Callable[..., Any]:
        if program.mode == "export":
            exported = passkit.export(model, _fresh_inputs(inputs), pipeline=pipeline, dynamic_shapes=_dims(program, inputs),
                                      repro_dir="")
            return exported.module()
        # No reproducer per failing program: a difference gets one, from its reduced program.
        return passkit.compile(model, pipeline=pipeline, dynamic=program.dynamic, cache="off", on_error="raise", repro_dir="")

    return compiled


def torch_path(program: FuzzProgram, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Callable[..., Any]:
    """Torch's own way through: AOT Autograd without a code generator, or export and decompose."""
    if program.mode == "export":
        exported = torch.export.export(model, tuple(_fresh_inputs(inputs)), dynamic_shapes=_dims(program, inputs))
        return exported.run_decompositions().module()
    return torch.compile(model, backend="aot_eager", dynamic=program.dynamic)


def torch_path_for(pipeline: Any) -> Compiler:
    """Torch's path to judge ``pipeline`` by: ``torch_path``, or for a pipeline that generates
    code with Inductor, ``torch.compile``'s Inductor with the same ``fallback_random``."""
    inductor = next((step for step in pipeline.steps if step.enabled and step.pass_name == "codegen.inductor"), None)
    if inductor is None:
        return torch_path
    options = {"fallback_random": inductor.options.fallback_random}

    def path(program: FuzzProgram, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Callable[..., Any]:
        if program.mode == "export":
            return torch_path(program, model, inputs)
        return torch.compile(model, backend="inductor", dynamic=program.dynamic, options=options)

    return path


def _dims(program: FuzzProgram, inputs: tuple[Any, ...]) -> Any:
    if not program.dynamic:
        return None
    return tuple({0: torch.export.Dim.AUTO} for _ in inputs)


def _state(call: Any, model: torch.nn.Module) -> torch.nn.Module:
    """The module holding the state a compiled call reads and writes (an exported program's
    own module holds copies)."""
    return call if isinstance(call, torch.nn.Module) and not hasattr(call, "_orig_mod") else model


def one_line(exc: BaseException) -> str:
    # Dynamo's BackendCompilerFailed says only "backend='aot_eager' raised:" on its first line.
    exc = getattr(exc, "inner_exception", None) or exc
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _run(compiler: Compiler, program: FuzzProgram, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Observed:
    twin = copy.deepcopy(model)
    torch.compiler.reset()
    call = compiler(program, twin, inputs)
    return observe(call, _state(call, twin), inputs, training=program.mode == "training")


def judge(program: FuzzProgram, compiler: Compiler, tolerance: Tolerance, theirs: Compiler = torch_path) -> Verdict:
    """Run ``program`` eagerly and through ``compiler``; on a difference, through torch's path
    (``theirs``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model, inputs = program.build()
            expected = observe(model, model, inputs, training=program.mode == "training")
        except Exception as exc:  # noqa: BLE001 - eager refuses the program: not a valid one
            return Verdict("invalid", message=one_line(exc))
        pristine, _ = program.build()
        try:
            found = differences(expected, _run(compiler, program, pristine, inputs), tolerance)
        except Exception as exc:  # noqa: BLE001 - whatever the pipeline raised is the finding
            found = [("crash", one_line(exc))]
        if not found:
            return Verdict("ok")
        kind, message = found[0]
        try:
            torch_found = differences(expected, _run(theirs, program, pristine, inputs), tolerance)
        except Exception as exc:  # noqa: BLE001
            return Verdict("skipped", kind, message, f"torch's path raised {one_line(exc)}")
        if torch_found:
            return Verdict("skipped", kind, message, f"torch's path differs too: {torch_found[0][1]}")
        return Verdict("difference", kind, message, details=[m for _, m in found])
