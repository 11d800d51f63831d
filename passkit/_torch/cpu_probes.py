"""Own Inductor's CPU vector-instruction probes: run early on a thread, and once per machine.

Before its first C++ kernel, a cache hit's included, Inductor checks which vector instruction
sets the CPU and the compiler support (``valid_vec_isa_list``): per set, it builds a probe
library (once, into its cache folder) and loads it in a fresh Python process. The library links
libtorch, so each load costs about 0.15 s of CPU: six of them, about 0.9 s of CPU and 1 s of
wall time, in every process. Eight ranks loading one compiled model from the shared cache paid
that eight times, more than the load itself.

- **Early.** ``start_cpu_probes`` runs them on a daemon thread when the backend is built, so
  they overlap Dynamo's trace. Every passkit call into Inductor waits for that thread first
  (``cpu_probes_settled``): the probes never run twice at once in a process, and no graph
  compiles while the answer is still open (an earlier version did not wait, and a process could
  compile for another instruction set than the next one chose).
- **Once per machine.** The thread writes the answer (each valid set, with the state its probe
  left on it, such as AVX-512 BF16 support) next to the probe libraries, in Inductor's cache
  folder, under a digest of what decides it: the torch build, the CPU's instruction sets as
  torch reads them, the C++ compiler's version and the Python executable. A later process on
  the same machine, or one of several started together (they take turns on a lock file),
  adopts that answer instead of probing. An answer that does not match, or does not rebuild the
  same compiler flags, is ignored and the probes run. The file is as trusted as the compiled
  kernels Inductor loads from the same folder.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

import torch

__all__ = ["cpu_probes_settled", "start_cpu_probes"]

log = logging.getLogger("passkit")

ANSWER_FORMAT = 1
LOCK_TIMEOUT_S = 120.0  # a process probing for longer than this is stuck; probe here too
# What a probe may leave on an instruction set besides its validity: whether the compiler also
# builds the set's optional extension, which then joins its compiler flags.
_PROBED_STATE = ("_is_avx512_bf16_supported", "_is_amx_fp16_supported")

_probes: threading.Thread | None = None
_probes_lock = threading.Lock()


def start_cpu_probes() -> None:
    """Answer Inductor's CPU probes once per process: from this machine's recorded answer at
    once, else on a daemon thread that probes (or waits for a process probing) and records. Not
    where CUDA is present (the first kernels are Triton's), nor once the answer is known."""
    global _probes
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    with _probes_lock:
        cache_info = getattr(valid_vec_isa_list, "cache_info", None)  # a functools cache on 2.11-2.15
        if _probes is not None or torch.cuda.is_available() or cache_info is None or cache_info().currsize:
            return

        try:
            machine = _machine()
            if machine is not None and _adopt(_answer_path(machine), machine):
                return  # before the thread, so a warm process imports no more than it needs
        except Exception:  # noqa: BLE001 - a machine passkit cannot describe: the probes run as before
            machine = None

        # The probes import torch.utils.cpp_extension, and with it setuptools, whose distutils
        # shim puts a finder into sys.meta_path and takes it out again. An import on another
        # thread that walks sys.meta_path meanwhile skips a finder, the path finder among them,
        # and fails: Dynamo's trace, importing torch.distributed.tensor.experimental, did
        # (ModuleNotFoundError, now and then). So that import happens here, before the thread.
        importlib.import_module("torch.utils.cpp_extension")

        def probe() -> None:
            with contextlib.suppress(Exception):  # Inductor probes again, and reports, when it needs them
                _answer_once_per_machine(machine)

        _probes = threading.Thread(target=probe, name="passkit-inductor-cpu-probes", daemon=True)
        _probes.start()


def cpu_probes_settled() -> None:
    """Wait for ``start_cpu_probes``'s thread, if one runs: call before handing Inductor a graph."""
    probes = _probes
    if probes is not None and probes is not threading.current_thread():
        probes.join()


def _answer_once_per_machine(machine: dict[str, Any] | None) -> None:
    from torch._inductor import cpu_vec_isa

    if machine is None:  # not a CPU whose answer passkit knows how to carry over: probe as Inductor does
        cpu_vec_isa.valid_vec_isa_list()
        return
    from filelock import FileLock, Timeout

    path = _answer_path(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            if _adopt(path, machine):
                return
            answer = cpu_vec_isa.valid_vec_isa_list()
            _record(path, machine, answer)
    except Timeout:
        cpu_vec_isa.valid_vec_isa_list()


def _machine() -> dict[str, Any] | None:
    """What decides the probes' answer on this machine; None where it is not carried over (not
    x86-64 Linux, or Inductor told to skip the probes)."""
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler
    from torch._inductor.cpu_vec_isa import x86_isa_checker

    if sys.platform != "linux" or platform.machine() != "x86_64" or config.cpp.vec_isa_ok is not None:
        return None
    try:
        compiler = get_cpp_compiler()
        version = get_compiler_version_info(compiler)
    except Exception:  # noqa: BLE001 - no compiler to name: Inductor's own probes say what is wrong
        return None
    return {
        "torch": torch.__version__,
        "torch_lib": os.path.join(os.path.dirname(torch.__file__), "lib"),
        "python": sys.executable,
        "cpu": x86_isa_checker(),
        "extensions": [bool(getattr(torch.cpu, name, lambda: False)()) for name in ("_is_avx512_bf16_supported", "_is_amx_fp16_supported")],
        "compiler": [compiler, version],
    }


def _answer_path(machine: dict[str, Any]) -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    digest = hashlib.sha256(json.dumps(machine, sort_keys=True).encode()).hexdigest()[:24]
    return Path(cache_dir()) / "passkit" / f"cpu-probes-{digest}.json"


def _record(path: Path, machine: dict[str, Any], answer: list[Any]) -> None:
    sets = [{"name": str(isa), "flags": isa.build_arch_flags(),
             "state": {name: vars(isa)[name] for name in _PROBED_STATE if name in vars(isa)}} for isa in answer]
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"format": ANSWER_FORMAT, "machine": machine, "sets": sets}, indent=1))
    os.replace(temporary, path)


def _adopt(path: Path, machine: dict[str, Any]) -> bool:
    """Install a recorded answer as Inductor's, if it is this machine's and rebuilds the same
    compiler flags; False (nothing changed) otherwise."""
    from torch._inductor import cpu_vec_isa

    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict) or recorded.get("format") != ANSWER_FORMAT or recorded.get("machine") != machine:
        return False
    known = {str(isa): isa for isa in cpu_vec_isa.supported_vec_isa_list}
    sets = recorded.get("sets")
    if not isinstance(sets, list) or any(not isinstance(s, dict) or s.get("name") not in known for s in sets):
        return False
    chosen, before = [], []
    for found in sets:
        isa, state = known[found["name"]], found.get("state", {})
        if not isinstance(state, dict) or set(state) - set(_PROBED_STATE) or not all(isinstance(v, bool) for v in state.values()):
            _restore(before)
            return False
        before.append((isa, {name: vars(isa).get(name) for name in _PROBED_STATE if name in vars(isa)}))
        for name, value in state.items():
            setattr(isa, name, value)
        if isa.build_arch_flags() != found.get("flags"):
            _restore(before)
            return False
        chosen.append(isa)
    cpu_vec_isa.valid_vec_isa_list = functools.cache(lambda: list(chosen))
    cpu_vec_isa.valid_vec_isa_list()  # answered: start_cpu_probes reads the cache's size
    log.debug("passkit: Inductor's CPU probes answered from %s", path)
    return True


def _restore(before: list[tuple[Any, dict[str, Any]]]) -> None:
    for isa, state in before:
        for name in _PROBED_STATE:
            if name in state:
                setattr(isa, name, state[name])
            elif name in vars(isa):
                delattr(isa, name)
