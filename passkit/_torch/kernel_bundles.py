"""Own kernel bundles: the C++ kernels of one Inductor graph built as a few shared libraries
instead of one library each.

Inductor builds every C++ kernel (``AsyncCompile.cpp_pybinding``) as a library of its own, and
each build pays the same fixed costs before it compiles the kernel itself: loading the 150 MB
precompiled header (0.55 s on a 2-core EPYC) and linking against libtorch (0.2-0.45 s), against
0.2-0.4 s for the kernel's own code. Nine kernels of the conv/BN benchmark took 9.9 s of g++
built one by one, and 2.0 s as one library.

While a ``KernelBundler`` is installed (``kernels_compiled_together(bundle=True)``), a kernel
that the graph's module asks for is held back and stands as a ``BundledKernel`` future. When
the module waits for its kernels, the held ones are built as at most one library per compile
worker: each kernel in a namespace of its own, with a Python binding per kernel that parses its
arguments exactly as Inductor's binding does. A kernel whose source has another shape than the
one expected (one ``extern "C"`` entry named ``kernel``, no macros) is built alone, as Inductor
would; a bundle that fails to build or load is built again kernel by kernel, so bundling can cost
time but never a compile.
"""

from __future__ import annotations

import logging
import re
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["bundle_source", "can_bundle"]

log = logging.getLogger("passkit")

_ENTRY = re.compile(r'extern\s+"C"\s+void\s+kernel\s*\(')
# A kernel in a bundle is a namespace of its own; what a namespace cannot hold keeps it alone.
_UNBUNDLEABLE = ("#define", "#undef", "PyInit")
# A bundle holds no fewer kernels than this before another worker gets one: each library pays
# the header and the link once, about as much as two or three kernels' own code.
MIN_KERNELS_PER_BUNDLE = 3


def can_bundle(source: str) -> bool:
    """Whether a kernel's source has the shape a bundle expects (else it is built alone): one
    ``extern "C"`` entry named ``kernel``, no macros, and its includes before any code (they
    move to the top of the bundle, out of the kernel's namespace)."""
    if len(_ENTRY.findall(source)) != 1 or source.count('extern "C"') != 1:
        return False
    if any(marker in source for marker in _UNBUNDLEABLE):
        return False
    code_started = False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#include"):
            if code_started:
                return False
        elif stripped:
            code_started = True
    return True


def _parse(argtype: str, n: int) -> str:
    return f"parse_arg<{argtype.replace('const ', '')}>(args, {n})"


_BINDINGS_HEAD = textwrap.dedent(
    """
    // passkit kernel bundle: Python bindings, one per kernel above.
    #define PY_SSIZE_T_CLEAN
    #include <Python.h>
    #include <cstdlib>
    #include <cerrno>
    #include <stdexcept>

    // torch's tensor -> data pointer function; its address arrives in an environment variable
    // that Inductor's loader sets, as for Inductor's own kernels.
    static void* (*passkit_tensor_data_ptr)(PyObject* obj);

    template <typename T> static inline T parse_arg(PyObject* args, size_t n) {
        static_assert(std::is_pointer_v<T>, "arg type must be pointer or long");
        return static_cast<T>(passkit_tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
    }
    template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {
        auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
        if (result == -1 && PyErr_Occurred()) [[unlikely]] throw std::runtime_error("expected int arg");
        return result;
    }
    template <> inline uintptr_t parse_arg<uintptr_t>(PyObject* args, size_t n) {
        auto result = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, n));
        if (result == reinterpret_cast<void*>(-1) && PyErr_Occurred()) [[unlikely]] throw std::runtime_error("expected int arg");
        return reinterpret_cast<uintptr_t>(result);
    }
    template <> inline float parse_arg<float>(PyObject* args, size_t n) {
        auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
        if (result == -1.0 && PyErr_Occurred()) [[unlikely]] throw std::runtime_error("expected float arg");
        return static_cast<float>(result);
    }
    """
)

_BINDING = textwrap.dedent(
    """
    static PyObject* {name}_py(PyObject* self, PyObject* args) {{
        try {{
            if (!PyTuple_CheckExact(args)) [[unlikely]] throw std::runtime_error("tuple args required");
            if (PyTuple_GET_SIZE(args) != {arity}) [[unlikely]] throw std::runtime_error("requires {arity} args");
            {namespace}::kernel({arguments});
            Py_RETURN_NONE;
        }} catch (std::exception const& e) {{
            PyErr_SetString(PyExc_RuntimeError, e.what());
            return nullptr;
        }} catch (...) {{
            PyErr_SetString(PyExc_RuntimeError, "unhandled error");
            return nullptr;
        }}
    }}
    """
)

_MODULE = textwrap.dedent(
    """
    static PyMethodDef passkit_methods[] = {{
    {methods}
        {{NULL, NULL, 0, NULL}}}};

    static struct PyModuleDef passkit_module = {{PyModuleDef_HEAD_INIT, "kernel", NULL, -1, passkit_methods}};

    PyMODINIT_FUNC PyInit_kernel(void) {{
        const char* address = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
        if (!address) {{
            PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR must be set");
            return nullptr;
        }}
        char* end = nullptr;
        errno = 0;
        uintptr_t value = std::strtoull(address, &end, 10);
        if (errno != 0 || end == address || value == 0) {{
            PyErr_SetString(PyExc_RuntimeError, "cannot parse _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
            return nullptr;
        }}
        passkit_tensor_data_ptr = reinterpret_cast<decltype(passkit_tensor_data_ptr)>(value);
        return PyModule_Create(&passkit_module);
    }}
    """
)


def bundle_source(kernels: Sequence[tuple[Sequence[str], str]]) -> str:
    """One C++ library's source for ``kernels`` (argument types, Inductor's source), each
    callable from Python as ``kernel_<i>`` of the module ``kernel``."""
    includes: list[str] = []
    bodies: list[str] = []
    bindings: list[str] = []
    methods: list[str] = []
    for i, (argtypes, source) in enumerate(kernels):
        lines = []
        for line in source.splitlines():
            if line.strip().startswith("#include"):
                if line.strip() not in includes:
                    includes.append(line.strip())
            else:
                lines.append(line)
        namespace = f"passkit_kernel_{i}"
        body = _ENTRY.sub("void kernel(", "\n".join(lines), count=1)
        bodies.append(f"namespace {namespace} {{\n{body}\n}}  // namespace {namespace}\n")
        arguments = ", ".join(_parse(t, n) for n, t in enumerate(argtypes))
        bindings.append(_BINDING.format(name=namespace, arity=len(argtypes), namespace=namespace, arguments=arguments))
        methods.append(f'    {{"kernel_{i}", {namespace}_py, METH_VARARGS, ""}},')
    return "\n".join([*includes, "", *bodies, _BINDINGS_HEAD, *bindings, _MODULE.format(methods="\n".join(methods))])


def _chunks(kernels: list[BundledKernel], workers: int) -> list[list[BundledKernel]]:
    """Split kernels into at most ``workers`` bundles of similar source size, in order within each."""
    count = max(1, min(workers, len(kernels) // MIN_KERNELS_PER_BUNDLE))
    loads = [0] * count
    chunks: list[list[BundledKernel]] = [[] for _ in range(count)]
    for kernel in sorted(kernels, key=lambda k: -len(k.source)):
        lightest = loads.index(min(loads))
        chunks[lightest].append(kernel)
        loads[lightest] += len(kernel.source)
    return [sorted(chunk, key=lambda k: k.order) for chunk in chunks if chunk]


def _codecache() -> Any:
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    return CppPythonBindingsCodeCache


def _lambda_future() -> type:
    from torch._inductor.codecache import LambdaFuture

    return LambdaFuture


@dataclass
class _Bundle:
    """One library of several kernels; loaded once, then each kernel is an attribute of it."""

    kernels: list[BundledKernel]
    load: Callable[[], Any]
    module: Any = None
    failed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def function(self, kernel: BundledKernel) -> Callable[..., Any]:
        with self.lock:
            if self.module is None and not self.failed:
                try:
                    self.module = self.load()
                except Exception as exc:  # noqa: BLE001 - a bundle problem costs time, never the compile
                    log.debug("passkit: a kernel bundle did not build (%s); building its kernels one by one", exc)
                    self.failed = True
                    kernel.owner.libraries -= 1
                    for each in self.kernels:
                        each.build_alone()
        if self.failed:
            return kernel.alone()
        return getattr(self.module, f"kernel_{kernel.slot}")


class BundledKernel:
    """A held-back kernel: Inductor's future for it, resolved from its bundle's library."""

    def __init__(self, owner: KernelBundler, order: int, argtypes: Sequence[str], source: str,
                 submit: Callable[..., Any] | None) -> None:
        self.owner, self.order, self.argtypes, self.source, self.submit = owner, order, list(argtypes), source, submit
        self.bundle: _Bundle | None = None
        self.slot = 0  # its position in the bundle: the binding ``kernel_<slot>``
        self._alone: Callable[[], Any] | None = None

    def build_alone(self) -> None:
        """Start building this kernel as a library of its own, as Inductor would."""
        if self._alone is None:
            self._alone = _codecache().load_pybinding_async(self.argtypes, self.source, submit_fn=self.submit)
            self.owner.libraries += 1

    def alone(self) -> Callable[..., Any]:
        self.build_alone()
        return self._alone()  # type: ignore[misc]

    def result(self) -> Callable[..., Any]:
        if self.bundle is None:
            return self.alone()
        return self.bundle.function(self)


class KernelBundler:
    """Holds back the kernels a graph's module asks for, and bundles them when it waits.

    ``kernels`` counts the C++ kernels asked for, ``libraries`` the libraries built for them.
    """

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self.held: list[BundledKernel] = []
        self.kernels = 0
        self.libraries = 0
        self.futures: dict[int, Any] = {}  # id -> every future handed out, to resolve them

    def hold(self, argtypes: Sequence[str], source: str, submit: Callable[..., Any] | None) -> Any:
        """A future for one kernel (built at the next ``flush``), or None when it must be built alone."""
        self.kernels += 1
        if not can_bundle(source):
            self.libraries += 1
            return None
        # Inductor builds in this process without workers; a submit then runs under the build's file lock.
        kernel = BundledKernel(self, self.kernels, argtypes, source, submit if self.workers > 1 else None)
        self.held.append(kernel)
        future = _lambda_future()(kernel.result)
        self.futures[id(future)] = future
        return future

    def flush(self) -> None:
        """Start building the held kernels: alone when there is one, else in bundles."""
        held, self.held = self.held, []
        if len(held) <= 1:
            for kernel in held:
                kernel.build_alone()
            return
        for chunk in _chunks(held, self.workers):
            code = bundle_source([(k.argtypes, k.source) for k in chunk])
            try:
                load = _codecache().load_async(code, "cpu", submit_fn=chunk[0].submit)
            except Exception as exc:  # noqa: BLE001 - built alone, a kernel fails with its own error
                log.debug("passkit: a kernel bundle could not start (%s); building its kernels one by one", exc)
                for kernel in chunk:
                    kernel.build_alone()
                continue
            self.libraries += 1
            bundle = _Bundle(chunk, load)
            for slot, kernel in enumerate(chunk):
                kernel.bundle, kernel.slot = bundle, slot

    def resolve(self, scope: dict[str, Any]) -> None:
        """Put each kernel this bundler handed out into ``scope`` in place of its future."""
        for name, value in list(scope.items()):
            if id(value) in self.futures and self.futures[id(value)] is value:
                scope[name] = value.result()
