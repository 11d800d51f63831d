"""Own how Inductor's kernel compiles overlap: a graph's kernels go on compiling in Inductor's
worker processes while Python lowers the next graph, and on the CPU a graph's C++ kernels are
built as a few libraries (``kernel_bundles``).

Inductor's ``AsyncCompile.wait`` and ``cpp_pybinding`` are stood in for while a
``kernels_compiled_together`` block is open, on the thread that opened it only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

from passkit._torch.kernel_bundles import KernelBundler

__all__ = ["KernelBuilds", "kernels_compiled_together"]


@contextlib.contextmanager
def kernels_compiled_together(*, bundle: bool = True, device_type: str = "cpu") -> Any:
    """Inside, a graph compiled on this thread does not wait for its kernels: they go on
    compiling in Inductor's worker processes while Python lowers the next graph (a training
    step's backward), and leaving waits for all of them. Inductor alone waits after each graph,
    so its workers sit idle while it lowers the backward; here that time overlaps.

    With ``bundle``, each graph's C++ kernels are built as a few libraries rather than one each
    (``kernel_bundles``): the same code, for a fraction of the compiler's time.

    The compiled callables must not run before the block is left (their kernels are bound then).
    Yields a ``KernelBuilds`` that counts, once the block is left, the C++ kernels and the
    libraries built for them. Other threads, and this one outside the block, compile as usual.

    Off the CPU (``device_type``) the kernels are Triton's, and Inductor's FX graph cache stores
    a graph's Triton binaries only if they are built by the time the graph is saved: waits are
    not put off there, nothing is bundled, and the block counts the kernels Inductor generated.
    """
    if device_type != "cpu":
        from torch._inductor import metrics

        generated = metrics.generated_kernel_count
        builds = KernelBuilds(generated_before=generated)
        yield builds
        builds.triton_kernels = metrics.generated_kernel_count - generated
        return
    block = _Block(KernelBundler(_compile_workers()) if bundle else None)
    originals = _hook_async_compile()
    outer, _this_thread.block = getattr(_this_thread, "block", None), block
    from torch._inductor import metrics

    builds = KernelBuilds(generated_before=metrics.generated_kernel_count)
    try:
        yield builds
    finally:
        _this_thread.block = outer
        _unhook_async_compile()
    wait = originals["wait"]
    for compiler, scope in block.pending:
        if block.bundler is not None:
            block.bundler.resolve(scope)  # Inductor's wait resolves futures only with compile workers
        wait(compiler, scope)
    if block.bundler is not None:
        builds.kernels, builds.libraries = block.bundler.kernels, block.bundler.libraries


@dataclasses.dataclass
class _Block:
    """One thread's ``kernels_compiled_together`` block: its bundler and the waits it put off."""

    bundler: KernelBundler | None
    pending: list[tuple[Any, dict[str, Any]]] = dataclasses.field(default_factory=list)


_this_thread = threading.local()
_hooks_lock = threading.Lock()
_hooks: dict[str, Any] = {}  # Inductor's own methods while ours stand in, and how many blocks use them


def _hook_async_compile() -> dict[str, Any]:
    """Stand in for ``AsyncCompile.wait`` and ``cpp_pybinding`` while any block is open; each
    acts for the thread whose block is open and calls Inductor's own otherwise."""
    from torch._inductor.async_compile import AsyncCompile

    with _hooks_lock:
        if not _hooks:
            wait, cpp_pybinding = AsyncCompile.wait, AsyncCompile.cpp_pybinding

            def wait_later(self: Any, scope: dict[str, Any]) -> None:
                block = getattr(_this_thread, "block", None)
                if block is None:
                    return wait(self, scope)
                if block.bundler is not None:
                    block.bundler.flush()
                block.pending.append((self, scope))
                return None

            def hold_kernel(self: Any, argtypes: Any, source_code: str) -> Any:
                block = getattr(_this_thread, "block", None)
                if block is not None and block.bundler is not None:
                    held = block.bundler.hold(argtypes, source_code, self.submit)
                    if held is not None:
                        return held
                return cpp_pybinding(self, argtypes, source_code)

            _hooks.update(wait=wait, cpp_pybinding=cpp_pybinding, blocks=0)
            AsyncCompile.wait = wait_later  # type: ignore[method-assign]
            AsyncCompile.cpp_pybinding = hold_kernel  # type: ignore[method-assign]
        _hooks["blocks"] += 1
        return dict(_hooks)


def _unhook_async_compile() -> None:
    from torch._inductor.async_compile import AsyncCompile

    with _hooks_lock:
        _hooks["blocks"] -= 1
        if _hooks["blocks"] == 0:
            AsyncCompile.wait = _hooks["wait"]  # type: ignore[method-assign]
            AsyncCompile.cpp_pybinding = _hooks["cpp_pybinding"]  # type: ignore[method-assign]
            _hooks.clear()


@dataclasses.dataclass
class KernelBuilds:
    """The C++ kernels a ``kernels_compiled_together`` block asked for, and the libraries built
    for them (0 and 0 without bundling: Inductor builds one library per kernel), or on a GPU the
    Triton kernels it generated."""

    kernels: int = 0
    libraries: int = 0
    triton_kernels: int = 0  # off the CPU: the kernels Inductor generated (none on an FX-cache hit)
    generated_before: int = dataclasses.field(default=0, repr=False)

    def generated_so_far(self) -> int:
        """The kernels Inductor has generated (C++ or Triton) since the block began; safe to read
        from another thread while the block runs (a progress heartbeat)."""
        from torch._inductor import metrics

        return max(0, metrics.generated_kernel_count - self.generated_before)


def _compile_workers() -> int:
    """How many processes Inductor compiles kernels in (1: in this one)."""
    from torch._inductor import config as inductor_config

    try:
        from torch._inductor.async_compile import get_compile_threads
    except ImportError:  # torch 2.11 reads the config directly
        return int(inductor_config.compile_threads or 1)
    return int(get_compile_threads())
