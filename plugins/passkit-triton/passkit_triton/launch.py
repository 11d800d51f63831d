"""Own running a region's kernel: the source cache, sizes and strides, block choice, fallback.

Kernels are cached by their source text: the text is written once to a file under the cache
directory (``PASSKIT_TRITON_CACHE_DIR``, or a per-user folder in the temp directory) and
imported, because ``triton.jit`` reads a kernel's source from its file. Two regions with the same
text share one kernel.

At each call the launcher reads the domain's sizes from the input tensors (a *recipe* found at
compile time: which input dimension carries each symbolic size), allocates the outputs, and
computes every input's strides against the domain, with 0 where the input broadcasts. The block
shape is chosen per (rows, columns) size class: by timing every candidate once on the first
call when ``autotune`` is on, otherwise the first candidate, and then remembered.

When a region cannot run as a kernel (CPU tensors without ``TRITON_INTERPRET=1``, rows longer
than ``max_row``, a tensor spanning 2**31 or more elements, an empty domain) its ATen submodule runs instead, and
``fallbacks`` counts it, so the result is always right (CPU tensors also warn, once).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from passkit_triton.kernels import KernelSpec

__all__ = ["Config", "RegionLauncher", "cache_dir", "load_kernel", "next_power_of_2"]

_KERNELS: dict[tuple[str, bool], Any] = {}
_INT32_LIMIT = 2**31
_GRID_Y_LIMIT = 65535


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
    """How many elements past its first one a tensor reaches: offsets are 32-bit in the kernel."""
    return sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0) + 1


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int


@dataclass
class RegionLauncher:
    """Callable that runs one region: ``launcher(*inputs) -> tuple of outputs``."""

    spec: KernelSpec
    recipe: tuple[tuple[int, int] | int, ...]  # per domain dim: (input, dim) or a constant
    domain_rank: int  # the region's own rank; the kernel's is max(1, this)
    fallback: Callable[..., Any]
    block_sizes: Sequence[int]
    num_warps: int | None
    autotune: bool
    max_row: int
    chosen: dict[tuple[int, int], Config] = field(default_factory=dict)
    calls: int = 0
    fallbacks: int = 0

    def __call__(self, *inputs: Any) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        domain = [inputs[entry[0]].shape[entry[1]] if isinstance(entry, tuple) else entry for entry in self.recipe]
        kernel_domain = domain if domain else [1]
        rows_count = 1
        for size in kernel_domain[:-1]:
            rows_count *= size
        columns = kernel_domain[-1]
        if rows_count * columns == 0 or not self._can_launch(inputs, rows_count * columns, columns):
            # Empty domains too: a sum over empty rows is zeros, an amax an error, as ATen says.
            self.fallbacks += 1
            return tuple(self.fallback(*inputs))
        device = inputs[0].device
        outputs = tuple(torch.empty(self._output_shape(kind, domain), dtype=dtype, device=device) for kind, dtype in self.spec.outputs)
        strides = self._strides(inputs, kernel_domain)
        args = [*inputs, *outputs, rows_count, columns, *kernel_domain[:-1], *strides]
        config = self._config(args, rows_count, columns, outputs)
        self._launch(args, config, rows_count, columns)
        return outputs

    def _can_launch(self, inputs: Sequence[Any], elements: int, columns: int) -> bool:
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        if not tensors:
            return False
        device = tensors[0].device
        if device.type != "cuda" and not interpreting():
            _warn_once(f"passkit-triton: fusion regions on {device.type} tensors run their ATen ops; kernels need CUDA, or TRITON_INTERPRET=1")
            return False
        if any(t.device != device for t in tensors):
            return False
        if elements >= _INT32_LIMIT or any(_span(t) >= _INT32_LIMIT for t in tensors):
            return False
        return not (self.spec.has_reduction and next_power_of_2(columns) > self.max_row)

    def _output_shape(self, kind: str, domain: list[int]) -> list[int]:
        if kind == "full":
            return domain
        return domain[:-1] + [1] if kind == "row" else domain[:-1]

    def _strides(self, inputs: Sequence[Any], kernel_domain: list[int]) -> list[int]:
        strides: list[int] = []
        rank = len(kernel_domain)
        for load in self.spec.loads:
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
                strides.append(0 if broadcast else tensor.stride(source))
        return strides

    def _candidates(self, rows_count: int, columns: int) -> list[Config]:
        found: list[Config] = []
        row_width = next_power_of_2(columns)
        for elements in self.block_sizes:
            block_n = row_width if self.spec.has_reduction else min(row_width, elements)
            block_n = max(block_n, next_power_of_2(-(-columns // _GRID_Y_LIMIT)))  # CUDA's grid y limit
            block_m = min(next_power_of_2(rows_count), max(1, elements // block_n))
            warps = self.num_warps or (4 if block_m * block_n <= 2048 else 8 if block_m * block_n <= 8192 else 16)
            config = Config(block_m, block_n, warps)
            if config not in found:
                found.append(config)
        return found

    def _config(self, args: list[Any], rows_count: int, columns: int, outputs: tuple[torch.Tensor, ...]) -> Config:
        key = (next_power_of_2(rows_count), next_power_of_2(columns))
        config = self.chosen.get(key)
        if config is not None:
            return config
        candidates = self._candidates(rows_count, columns)
        if self.autotune and len(candidates) > 1:
            timings = [(self._time(args, c, rows_count, columns), i) for i, c in enumerate(candidates)]
            config = candidates[min(timings)[1]]
        else:
            config = candidates[0]
        self.chosen[key] = config
        return config

    def _time(self, args: list[Any], config: Config, rows_count: int, columns: int) -> float:
        # Kernels only read their inputs and overwrite fresh outputs, so trial runs are harmless.
        self._launch(args, config, rows_count, columns)  # compile outside the timing
        samples = []
        for _ in range(1 if interpreting() else 5):
            if args[0].device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self._launch(args, config, rows_count, columns)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            else:
                started = time.perf_counter()
                self._launch(args, config, rows_count, columns)
                samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    def _launch(self, args: list[Any], config: Config, rows_count: int, columns: int) -> None:
        kernel = load_kernel(self.spec.source, self.spec.name)
        grid = (
            (rows_count + config.block_m - 1) // config.block_m,
            (columns + config.block_n - 1) // config.block_n,
        )
        kernel[grid](*args, BLOCK_M=config.block_m, BLOCK_N=config.block_n, num_warps=config.num_warps)
