"""Own running a region's kernel: the source cache, the per-shape launch plan, the fast launch.

Kernels are cached by their source text: the text is written once to a file under the cache
directory (``PASSKIT_TRITON_CACHE_DIR``, or a per-user folder in the temp directory) and
imported, because ``triton.jit`` reads a kernel's source from its file. Two regions with the same
text share one kernel.

A call looks its inputs' shapes, strides, dtypes, devices and pointer alignments up in a table
of *plans*. The first call with a new key works out the plan (:meth:`RegionLauncher.plan`: the
domain's sizes from a recipe found at compile time, every input's strides against the domain,
the kernel variant, the block shape and the grid); later calls allocate the outputs and launch.
On a GPU the first launch goes through Triton's JIT, which compiles the kernel for that key's
specialization; later launches call the compiled kernel's launcher directly (no argument
binding, no cache lookup), so a call costs a dict lookup, one ``torch.empty`` per output and the
launch, and makes no host-device synchronization (CUDA graphs can capture it).

Kernels launch on their tensors' device (``torch.cuda.device`` around the launch when it is not
the current one). The block shape comes from the sizes; ``autotune = true`` instead times the
candidates on the first call of each size class. Rows longer than ``max_row`` use the looped
kernel, tensors of 2**31 elements or more the int64-indexed one.

Only when a region cannot run as a kernel (CPU tensors without ``TRITON_INTERPRET=1``, inputs
on different devices, an empty domain) does its ATen submodule run, and ``fallbacks`` counts it
(CPU tensors also warn, once), so the result is always right.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import torch

from passkit_triton.kernels import KernelSpec

__all__ = ["Config", "Plan", "RegionLauncher", "cache_dir", "load_kernel", "next_power_of_2"]

_KERNELS: dict[tuple[str, bool], Any] = {}
_INT32_LIMIT = 2**31
_GRID_Y_LIMIT = 65535
_MAX_PLANS = 64  # per region: sizes that keep changing must not grow the table without end
_FALLBACK = object()


def cache_dir() -> Path:
    configured = os.environ.get("PASSKIT_TRITON_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"passkit-triton-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def load_kernel(source: str, name: str) -> Any:
    """The ``triton.jit`` function for ``source``, compiled once per distinct source text."""
    key = (source, interpreting())  # an interpreted kernel is another object than a compiled one
    kernel = _KERNELS.get(key)
    if kernel is not None:
        return kernel
    if key[1]:
        _check_interpreted_library()
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"region_{digest}.py"
    if not path.exists() or path.read_text() != source:
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(source)
        os.replace(partial, path)
    spec = importlib.util.spec_from_file_location(f"passkit_triton_region_{digest}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = _KERNELS[key] = getattr(module, name)
    return kernel


def _check_interpreted_library() -> None:
    import triton.language as tl

    if type(tl.sum).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "passkit-triton: TRITON_INTERPRET=1 was set after triton was imported; Triton's interpreter "
            "needs it set before the first `import triton`"
        )


def next_power_of_2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _span(tensor: torch.Tensor) -> int:
    """How many elements past its first one a tensor reaches."""
    return sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0) + 1


def _current_cuda_device() -> int:
    return torch.cuda.current_device()


def _device_guard(device: torch.device) -> ContextManager[Any]:
    """Make ``device`` current for a launch: Triton launches on the current CUDA device."""
    if device.type != "cuda" or device.index is None or device.index == _current_cuda_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device.index)


def _shape_key(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """What a launch plan depends on, and what Triton specializes a compiled kernel on: sizes,
    strides (both kernel arguments), dtypes, devices and 16-byte pointer alignment."""
    return tuple(
        [
            (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15 == 0) if isinstance(t, torch.Tensor) else type(t)
            for t in inputs
        ]
    )


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int


@dataclass
class Plan:
    """What one shape signature launches: everything but the tensors' addresses and scalars."""

    spec: KernelSpec
    config: Config
    grid: tuple[int, int]
    sizes: list[int]  # M, N, the domain's leading sizes, then every load's strides
    outputs: list[tuple[list[int], torch.dtype]]
    device: torch.device
    bound: Any = None  # the compiled kernel's launch, once the JIT has compiled it (GPU only)


@dataclass
class RegionLauncher:
    """Callable that runs one region: ``launcher(*inputs) -> tuple of outputs``."""

    spec: KernelSpec  # the whole-row, 32-bit form; variants come from ``variant``
    recipe: tuple[tuple[int, int] | int, ...]  # per domain dim: (input, dim) or a constant
    domain_rank: int  # the region's own rank; the kernel's is max(1, this)
    fallback: Callable[..., Any]
    block_sizes: Sequence[int]
    num_warps: int | None
    autotune: bool
    max_row: int
    variant: Callable[[bool, bool], KernelSpec] | None = None  # (looped, wide) -> spec
    chosen: dict[tuple[int, int], Config] = field(default_factory=dict)
    calls: int = 0
    fallbacks: int = 0
    plans: dict[Any, Any] = field(default_factory=dict)

    def __call__(self, *inputs: Any) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        key = _shape_key(inputs)
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= _MAX_PLANS:
                self.plans.clear()
            plan = self.plans[key] = self.plan(*inputs) or _FALLBACK
        if plan is _FALLBACK:
            self.fallbacks += 1
            return tuple(self.fallback(*inputs))
        device = plan.device
        outputs = tuple([torch.empty(shape, dtype=dtype, device=device) for shape, dtype in plan.outputs])
        args = [*inputs, *outputs, *plan.sizes]
        for index in plan.spec.scalars:
            args[index] = inputs[index].item()  # a CPU value: no device synchronization
        with _device_guard(device):
            self._launch(plan, args, inputs, outputs)
        return outputs

    def plan(self, *inputs: Any) -> Plan | None:
        """The launch plan for inputs of these shapes, or None when the ATen ops must run.

        Works on fake tensors too: it reads only shapes, strides, dtypes and devices.
        """
        domain = [inputs[entry[0]].shape[entry[1]] if isinstance(entry, tuple) else entry for entry in self.recipe]
        kernel_domain = [int(size) for size in domain] or [1]
        rows_count = 1
        for size in kernel_domain[:-1]:
            rows_count *= size
        columns = kernel_domain[-1]
        tensors = [t for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and i not in self.spec.scalars]
        if rows_count * columns == 0 or not tensors:
            # Empty domains too: a sum over empty rows is zeros, an amax an error, as ATen says.
            return None
        device = tensors[0].device
        if device.type != "cuda" and not interpreting():
            _warn_once(f"passkit-triton: fusion regions on {device.type} tensors run their ATen ops; kernels need CUDA, or TRITON_INTERPRET=1")
            return None
        if any(t.device != device for t in tensors):
            return None
        looped = self.spec.has_reduction and next_power_of_2(columns) > self.max_row
        wide = rows_count * columns >= _INT32_LIMIT or any(_span(t) >= _INT32_LIMIT for t in tensors)
        spec = self.spec if not (looped or wide) else self._variant(looped, wide)
        outputs = [(self._output_shape(kind, [int(s) for s in domain]), dtype) for kind, dtype in spec.outputs]
        sizes = [rows_count, columns, *kernel_domain[:-1], *self._strides(spec, inputs, kernel_domain)]
        config = self._config(spec, inputs, outputs, sizes, device, rows_count, columns)
        grid = (-(-rows_count // config.block_m), 1 if spec.looped else -(-columns // config.block_n))
        return Plan(spec, config, grid, sizes, outputs, device)

    def _variant(self, looped: bool, wide: bool) -> KernelSpec:
        if self.variant is None:
            raise RuntimeError("passkit-triton: this launcher was built without kernel variants (looped or int64)")
        return self.variant(looped, wide)

    def _output_shape(self, kind: str, domain: list[int]) -> list[int]:
        if kind == "full":
            return domain
        return domain[:-1] + [1] if kind == "row" else domain[:-1]

    def _strides(self, spec: KernelSpec, inputs: Sequence[Any], kernel_domain: list[int]) -> list[int]:
        strides: list[int] = []
        rank = len(kernel_domain)
        for load in spec.loads:
            tensor = inputs[load.input]
            if load.kind == "full":
                target_rank, keep = rank, rank
            elif load.kind == "row":
                target_rank, keep = rank, rank - 1
            else:
                target_rank, keep = rank - 1, rank - 1
            offset = target_rank - tensor.dim()
            for dim in range(keep):
                source = dim - offset
                broadcast = source < 0 or tensor.shape[source] == 1
                strides.append(0 if broadcast else int(tensor.stride(source)))
        return strides

    def _candidates(self, rows_count: int, columns: int, looped: bool = False) -> list[Config]:
        found: list[Config] = []
        row_width = next_power_of_2(columns)
        for elements in self.block_sizes:
            if looped:  # one row per program, walked in blocks of this many columns
                block_n, block_m = min(row_width, elements), 1
            else:
                block_n = row_width if self.spec.has_reduction else min(row_width, elements)
                block_n = max(block_n, next_power_of_2(-(-columns // _GRID_Y_LIMIT)))  # CUDA's grid y limit
                block_m = min(next_power_of_2(rows_count), max(1, elements // block_n))
            warps = self.num_warps or (4 if block_m * block_n <= 2048 else 8 if block_m * block_n <= 8192 else 16)
            config = Config(block_m, block_n, warps)
            if config not in found:
                found.append(config)
        return found

    def _config(self, spec: KernelSpec, inputs: Sequence[Any], outputs: list[Any], sizes: list[int],
                device: torch.device, rows_count: int, columns: int) -> Config:
        key = (next_power_of_2(rows_count), next_power_of_2(columns))
        config = self.chosen.get(key)
        if config is not None:
            return config
        candidates = self._candidates(rows_count, columns, spec.looped)
        if self.autotune and len(candidates) > 1 and not any(getattr(t, "fake_mode", None) for t in inputs):
            # Kernels only read their inputs and overwrite fresh outputs, so trial runs are harmless.
            scratch = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in outputs]
            args = [*inputs, *scratch, *sizes]
            for index in spec.scalars:
                args[index] = inputs[index].item()
            with _device_guard(device):
                timings = [(self._time(spec, args, c, rows_count, columns), i) for i, c in enumerate(candidates)]
            config = candidates[min(timings)[1]]
        else:
            config = candidates[0]
        self.chosen[key] = config
        return config

    def _time(self, spec: KernelSpec, args: list[Any], config: Config, rows_count: int, columns: int) -> float:
        grid = (-(-rows_count // config.block_m), 1 if spec.looped else -(-columns // config.block_n))
        kernel = load_kernel(spec.source, spec.name)
        run = lambda: kernel[grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, num_warps=config.num_warps)  # noqa: E731
        run()  # compile outside the timing
        samples = []
        for _ in range(1 if interpreting() else 5):
            if args[0].device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            else:
                started = time.perf_counter()
                run()
                samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    def _launch(self, plan: Plan, args: list[Any], inputs: Sequence[Any], outputs: Sequence[torch.Tensor]) -> None:
        config = plan.config
        if plan.bound is not None:
            try:
                plan.bound(args, config)
                return
            except TypeError:  # a Triton whose launcher takes other arguments: use the JIT from now on
                plan.bound = None
        kernel = load_kernel(plan.spec.source, plan.spec.name)
        compiled = kernel[plan.grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, num_warps=config.num_warps)
        if plan.device.type == "cuda":
            plan.bound = _bind(compiled, plan.grid, plan.device)


def _hooked(hook: Any) -> bool:
    """Whether a Triton launch hook is installed (a profiler): not None, nor an empty HookChain (newer Triton)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _bind(compiled: Any, grid: tuple[int, int], device: torch.device) -> Callable[[list[Any], Config], None] | None:
    """A direct call of ``compiled``'s launcher, or None where this Triton's layout is not known.

    Triton 3.3 and later pass every argument, constexprs included, after the grid, stream,
    function, metadata and hooks. Where a profiler has installed launch hooks when the kernel is
    bound, its launches keep going through the JIT, which calls them.
    """
    try:
        from triton import knobs
        from triton.runtime.driver import driver
    except ImportError:
        return None
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or any(_hooked(getattr(runtime, name, None)) for name in ("launch_enter_hook", "launch_exit_hook")):
        return None
    if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata", "launch_metadata")):
        return None
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    get_stream, index = driver.active.get_current_stream, device.index
    grid_0, grid_1 = grid

    def launch(args: list[Any], config: Config) -> None:
        run(grid_0, grid_1, 1, get_stream(index), function, metadata, None, None, None, *args, config.block_m, config.block_n)

    return launch
