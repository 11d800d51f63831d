"""Run torch's OpInfo and ModuleInfo samples through passkit and compare with eager.

The checks follow torch's own AOT Autograd sweep (``aot_autograd_check`` in
``torch/testing/_internal/optests/aot_autograd.py``): outputs and gradients of the sum of every
output's absolute sum, under the same seed, at the op's own tolerances. On top of values it
compares each output's dtype, ``requires_grad`` and whether it aliases an input, and the inputs
after the call (mutation). Shared by ``tests/sweep`` and ``tools/opinfo_figure.py``.
"""

from __future__ import annotations

import copy
import os
import zlib
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.testing._internal.common_device_type import toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_modules import module_db
from torch.testing._utils import wrapper_set_seed
from torch.utils import _pytree as pytree

import passkit

PIPELINE = "training-python"
DTYPE = torch.float32
SWEEP = os.environ.get("PASSKIT_SWEEP", "")
"""``full``: every sample of every entry. ``all``: the first sample of every entry. Unset: the
first sample of the entries in shard ``PASSKIT_SWEEP_SHARD`` (``k/n``, default ``0/3``)."""
FULL = SWEEP == "full"
SHARD = os.environ.get("PASSKIT_SWEEP_SHARD", "0/3")


def selected(name: str) -> bool:
    """Whether this run checks the entry: a stable hash of its name picks its shard."""
    if SWEEP in ("full", "all"):
        return True
    k, n = (int(part) for part in SHARD.split("/"))
    return zlib.crc32(name.encode()) % n == k

DEFAULT_TOL = (1.3e-6, 1e-5)  # torch.testing's float32 rtol, atol


class EagerFails(Exception):
    """Eager itself cannot run the check (``sum`` on ComplexHalf, an ill-posed gradient): not applicable."""


def op_id(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def module_id(info: Any) -> str:
    return info.name


def swept_ops() -> list[Any]:
    """Ops with an autograd formula and float32 CPU support, in op_db order."""
    return [op for op in op_db if op.supports_autograd and DTYPE in op.supported_dtypes("cpu")]


def swept_modules() -> list[Any]:
    return [m for m in module_db if DTYPE in m.dtypes]


def _tolerance(decorators: Sequence[Any], test_names: tuple[str, ...]) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOL
    for info in decorators:
        if not hasattr(info, "decorators") or not info.active_if:
            continue
        if info.test_name is not None and info.test_name not in test_names:
            continue
        if info.device_type not in (None, "cpu") or (info.dtypes is not None and DTYPE not in info.dtypes):
            continue
        for deco in info.decorators:
            if isinstance(deco, toleranceOverride) and DTYPE in deco.d:
                rtol, atol = max(rtol, deco.d[DTYPE].rtol), max(atol, deco.d[DTYPE].atol)
    return rtol, atol


def op_tolerance(op: Any) -> tuple[float, float]:
    return _tolerance(op.decorators, ("test_aot_autograd_exhaustive", "test_variant_consistency_eager"))


def _samples(op: Any) -> Iterator[Any]:
    samples = op.sample_inputs("cpu", DTYPE, requires_grad=True)
    if FULL:
        yield from samples
    else:
        yield next(iter(samples))


def _aliases(out: Any, inputs: Sequence[torch.Tensor]) -> list[int]:
    if not isinstance(out, torch.Tensor) or out.layout != torch.strided:
        return []
    ptr = out.untyped_storage().data_ptr()
    return [i for i, x in enumerate(inputs) if x.layout == torch.strided and x.untyped_storage().data_ptr() == ptr]


def _forward_backward(fn: Callable[..., Any], tensors: list[torch.Tensor]) -> tuple[Any, Any, list[Any]]:
    out = wrapper_set_seed(fn, tensors)
    flat = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    meta = [(o.dtype, o.requires_grad, _aliases(o, tensors)) for o in flat]
    wrt = [t for t in tensors if t.requires_grad]
    total: Any = 0
    for o in flat:
        if o.requires_grad:
            total = total + o.sum().abs()
    grads: Any = ()
    if wrt and isinstance(total, torch.Tensor):
        grads = torch.autograd.grad(total, wrt, allow_unused=True)
    return out, grads, meta


def _clone_inputs(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    clones = []
    for t in tensors:
        c = t.detach().clone()
        clones.append(c.requires_grad_(t.requires_grad) if t.is_leaf else (c.requires_grad_(True) * 1 if t.requires_grad else c))
    return clones


def check_function(fn: Callable[..., Any], tensors: list[torch.Tensor], tol: tuple[float, float]) -> None:
    """Compare ``fn(tensors)`` and its gradients, eager vs passkit; raise AssertionError on a difference."""
    rtol, atol = tol
    eager_inputs = _clone_inputs(tensors)
    compiled_inputs = _clone_inputs(tensors)
    try:
        expected, expected_grads, expected_meta = _forward_backward(fn, eager_inputs)
    except Exception as exc:  # noqa: BLE001 - whatever eager raises makes the entry not applicable
        raise EagerFails(f"{type(exc).__name__}: {exc}") from exc
    compiled = passkit.aot_function(fn, pipeline=PIPELINE)
    actual, actual_grads, actual_meta = _forward_backward(compiled, compiled_inputs)
    close = dict(rtol=rtol, atol=atol, equal_nan=True)
    torch.testing.assert_close(actual, expected, **close, msg=lambda m: f"outputs differ: {m}")
    if [m[:2] for m in actual_meta] != [m[:2] for m in expected_meta]:
        raise AssertionError(f"output dtype/requires_grad differ: {actual_meta} vs eager {expected_meta}")
    if [bool(m[2]) for m in actual_meta] != [bool(m[2]) for m in expected_meta]:
        raise AssertionError(f"output aliasing differs: {actual_meta} vs eager {expected_meta}")
    torch.testing.assert_close(actual_grads, expected_grads, **close, msg=lambda m: f"gradients differ: {m}")
    for got, want in zip(compiled_inputs, eager_inputs):
        torch.testing.assert_close(got.detach(), want.detach(), **close, msg=lambda m: f"inputs after the call differ: {m}")


def _tensor_only(args: Sequence[Any], kwargs: dict[str, Any], call: Callable[..., Any]) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    flat, spec = pytree.tree_flatten((list(args), kwargs))
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]

    def fn(tensor_args: Sequence[torch.Tensor]) -> Any:
        it = iter(tensor_args)
        rebuilt = [next(it) if isinstance(a, torch.Tensor) else a for a in flat]
        a, k = pytree.tree_unflatten(rebuilt, spec)
        return call(*a, **k)

    return fn, tensors


def check_op(op: Any) -> None:
    tol = op_tolerance(op)
    for sample in _samples(op):
        fn, tensors = _tensor_only([sample.input, *sample.args], dict(sample.kwargs), op.op)
        check_function(fn, tensors, tol)


def check_module(info: Any) -> None:
    """Each module input (the first, unless full) in train mode, through ``aot_module``."""
    torch.manual_seed(0)
    tol = _tolerance(info.decorators, ("test_aot_autograd_module_exhaustive",))
    inputs = info.module_inputs_func(info, device="cpu", dtype=DTYPE, requires_grad=True, training=True)
    for module_input in inputs if FULL else inputs[:1]:
        if module_input.forward_input is None:
            continue
        c_args, c_kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
        torch.manual_seed(0)
        eager_mod = info.module_cls(*c_args, **c_kwargs).to(DTYPE)
        eager_mod.train()
        args, kwargs = module_input.forward_input.args, module_input.forward_input.kwargs
        if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in eager_mod.parameters()):
            with torch.no_grad():  # lazy modules take their shapes from a first call
                eager_mod(*pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), (args, kwargs))[0])
        compiled_mod = copy.deepcopy(eager_mod)
        aot = passkit.aot_module(compiled_mod, pipeline=PIPELINE)
        eager_fn, tensors = _tensor_only(args, kwargs, eager_mod)
        compiled_fn, _ = _tensor_only(args, kwargs, aot)
        rtol, atol = tol
        eager_inputs, compiled_inputs = _clone_inputs(tensors), _clone_inputs(tensors)
        for mod, fn, ins in ((eager_mod, eager_fn, eager_inputs), (compiled_mod, compiled_fn, compiled_inputs)):
            out, grads, meta = _forward_backward(lambda t: fn(t), [*ins, *mod.parameters()])
            mod._sweep_result = (out, grads, meta, [b.clone() for b in mod.buffers()])
        e, c = eager_mod._sweep_result, compiled_mod._sweep_result
        close = dict(rtol=rtol, atol=atol, equal_nan=True)
        torch.testing.assert_close(c[0], e[0], **close, msg=lambda m: f"outputs differ: {m}")
        if [m[:2] for m in c[2]] != [m[:2] for m in e[2]]:
            raise AssertionError(f"output dtype/requires_grad differ: {c[2]} vs eager {e[2]}")
        torch.testing.assert_close(c[1], e[1], **close, msg=lambda m: f"gradients differ: {m}")
        torch.testing.assert_close(c[3], e[3], **close, msg=lambda m: f"buffers after the call differ: {m}")
