"""Own the compile cache's key: everything that decides what a compile produces, hashed.

``cache_key`` covers the resolved pipeline and its steps' fingerprints, the registered plugins,
the captured graphs' code and constants, the inputs' metadata and a symbolic program's guards,
the steps' cache contexts, the torch, Python and passkit versions and passkit's own sources, the
device, and torch's process-wide settings (``global_settings``). ``plan_digest`` is the part
that does not depend on the program, which a file mounted in Inductor's slots keys on.
``passkit.cache.store`` explains each part and stores the entries under these keys.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from typing import TYPE_CHECKING, Any, Iterable

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.core.pass_api import passkit_source_digest

if TYPE_CHECKING:
    from passkit.core.program import Program
    from passkit.pipeline import Pipeline

__all__ = ["FORMAT", "cache_key", "plan_digest", "global_settings"]

FORMAT = 4  # 4: entries signed (passkit.cache.entry v2); 3: a stored graph module's code checked with its region bodies' (2: graphs stored node by node)


@functools.lru_cache(maxsize=None)
def _versions() -> dict[str, str]:
    """Read once per process (as passkit's source digest is): ``importlib.metadata`` parses the
    METADATA files on each call, which cost a cache hit more than loading a small entry."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "passkit"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "unknown"
    return {**found, "python": platform.python_version()}


def global_settings() -> dict[str, Any]:
    """torch's process-wide switches that change what a compile traces or generates."""
    import torch.utils.deterministic

    cuda_matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return {
        "autocast": _torch.autocast_state(),
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic": [torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled(),
                          torch.utils.deterministic.fill_uninitialized_memory],
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul": [cuda_matmul.allow_tf32, cuda_matmul.allow_fp16_reduced_precision_reduction,
                        cuda_matmul.allow_bf16_reduced_precision_reduction],
        "cudnn": [cudnn.allow_tf32, cudnn.deterministic],
    }


def _tensor_meta(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return ["value", type(value).__name__, repr(value)]
    return [
        [str(size) for size in value.shape],
        [str(stride) for stride in value.stride()],
        str(value.dtype),
        str(value.device),
        bool(value.requires_grad),
    ]


def _device(program: Program) -> list[str]:
    """The devices of the inputs, with the GPU model and capability for CUDA devices."""
    devices = sorted({str(x.device) for x in program.example_inputs if isinstance(x, torch.Tensor)})
    described = []
    for name in devices:
        device = torch.device(name)
        if device.type == "cuda" and torch.cuda.is_available():
            index = device.index if device.index is not None else torch.cuda.current_device()
            name += f" {torch.cuda.get_device_name(index)} sm{''.join(map(str, torch.cuda.get_device_capability(index)))}"
        described.append(name)
    return described


def _tensor_digest(value: torch.Tensor) -> str:
    data = value.detach().cpu().contiguous()
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()


def _graphs_digest(program: Program) -> str:
    """Every graph's code (nested graph modules too) and the values of the tensors they hold."""
    digest = hashlib.sha256()
    for name in sorted(program.graphs):
        gm = program.graphs[name]
        for path, module in gm.named_modules():
            digest.update(f"{name}/{path}\0".encode())
            if isinstance(module, GraphModule):
                digest.update(module.code.encode())
        for key, value in sorted({**dict(gm.named_parameters()), **dict(gm.named_buffers())}.items()):
            digest.update(f"{key}={_tensor_digest(value)}".encode())
        for key, value in sorted(vars(gm).items()):
            if isinstance(value, torch.Tensor):
                digest.update(f"{key}={_tensor_digest(value)}".encode())
    return digest.hexdigest()


def cache_key(pipeline: Pipeline, program: Program, *, plugins: Iterable[str] = ()) -> str:
    """The hex key of ``program`` (as captured, before any step) compiled with ``pipeline``."""
    parts = {
        **_plan_parts(pipeline, plugins),
        "graphs": _graphs_digest(program),
        "inputs": [_tensor_meta(x) for x in program.example_inputs],
        "symbolic": _torch.symbolic_signature(program.example_inputs),
        "signature": repr(program.signature),
        "training": program.training,
        "facts": sorted(program.facts),
        "device": _device(program),
        "globals": global_settings(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def plan_digest(pipeline: Pipeline, plugins: Iterable[str] = ()) -> str:
    """The program-independent part of ``cache_key``: the resolved steps (their fingerprints and
    options), their cache contexts, the registered plugins and the versions of torch, Python and
    passkit and passkit's sources. A mounted file's Inductor slots key on it (their ``uuid``)."""
    return hashlib.sha256(json.dumps(_plan_parts(pipeline, plugins), sort_keys=True).encode()).hexdigest()


def _plan_parts(pipeline: Pipeline, plugins: Iterable[str]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "pipeline": pipeline.fingerprint(),
        "contexts": [[step.id, step.pass_.cache_context(step.options)]
                     for step in pipeline.steps if step.pass_.cache_context is not None],
        "plugins": sorted(plugins),
        "versions": dict(_versions()),
        "passkit_sources": passkit_source_digest(),
    }
