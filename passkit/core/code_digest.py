"""Own fingerprints of Python code by value: a function's compiled code, its defaults and
annotations, the values in its closure cells and the globals it reads, followed into the
helpers it calls.

A pass handed to a pipeline as an object (``@passkit.graph_pass`` in a notebook, no plugin) has
no installed file or distribution version to stand for its code, so the compile cache keys on
what the code is and what it reads. The code is hashed as compiled (bytecode, constants, names),
which is what runs: a source file edited after it was imported would describe other code, and a
comment changes nothing. Code from an installed distribution or the standard library is named
instead (module, qualified name and the distribution's version), as a registered pass's file
is. A value that cannot be hashed (a tensor, an arbitrary object) raises ``Unhashable`` with
what it was and where it was read, and the caller compiles without the cache.
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import sys
import types
from typing import Any

__all__ = ["Unhashable", "code_digest", "distribution_version", "installed"]

_SCALARS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
# Instances of installed types whose repr names them exactly (``torch.float32``, ``aten.neg.default``).
_NAMED_BY_REPR = {
    ("torch", "dtype"), ("torch", "device"), ("torch", "layout"), ("torch", "memory_format"),
    ("torch._ops", "OpOverload"), ("torch._ops", "OpOverloadPacket"),
}
_GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


class Unhashable(Exception):
    """A value the code reads that cannot be hashed; the message says which and where."""


def code_digest(value: Any, what: str = "the value") -> str:
    """sha256 over ``value`` by value: a function's code and everything it reads (see the module
    docstring), data by its contents. ``what`` names ``value`` in the error.

    Raises:
        Unhashable: ``value``, or a value a function in it reads, cannot be hashed.
    """
    return hashlib.sha256(_Hasher(value).value(value, what).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _top_level_distributions() -> dict[str, list[str]]:
    return dict(importlib.metadata.packages_distributions())


@functools.lru_cache(maxsize=None)
def distribution_version(module: str) -> str:
    """``name==version`` of the installed distribution providing ``module`` ("" if none)."""
    top = module.partition(".")[0]
    try:  # the usual case, a distribution named like its package, without scanning them all
        return f"{top}=={importlib.metadata.version(top)}"
    except (importlib.metadata.PackageNotFoundError, ValueError):
        pass
    found = []
    for dist in sorted(set(_top_level_distributions().get(top, []))):
        try:
            found.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ",".join(found)


@functools.lru_cache(maxsize=None)
def installed(module: str) -> bool:
    """Whether ``module`` is the standard library's or an installed distribution's (named, not
    hashed by value), rather than a notebook's, a script's or a local module's."""
    top = module.partition(".")[0]
    return top in sys.stdlib_module_names or top == "builtins" or bool(distribution_version(module))


def _article(value: Any) -> str:
    name = type(value).__qualname__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class _Hasher:
    """One digest's walk: tokens by object id for objects seen (a helper read twice), and the
    objects being hashed, so that a function calling itself ends the walk."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.done: dict[int, str] = {}
        self.active: set[int] = set()
        self.keep: list[Any] = []  # holds what ``done`` is keyed on, so no id is reused meanwhile

    def value(self, value: Any, what: str) -> str:
        if type(value) in _SCALARS:
            return f"{type(value).__name__}:{value!r}"
        key = id(value)
        if key in self.done:
            return self.done[key]
        if key in self.active:
            return f"recursive:{getattr(value, '__qualname__', type(value).__qualname__)}"
        self.active.add(key)
        try:
            token = self._token(value, what)
        finally:
            self.active.discard(key)
        self.done[key] = token
        self.keep.append(value)
        return token

    def _token(self, value: Any, what: str) -> str:
        kind = type(value)
        if kind in (list, tuple):
            return f"{kind.__name__}[{','.join(self.value(item, what) for item in value)}]"
        if kind in (set, frozenset):
            return f"{kind.__name__}{{{','.join(sorted(self.value(item, what) for item in value))}}}"
        if kind is dict:
            pairs = sorted(f"{self.value(k, what)}:{self.value(v, what)}" for k, v in value.items())
            return "dict{" + ",".join(pairs) + "}"
        if isinstance(value, (types.GenericAlias, types.UnionType)) or kind.__module__ in ("typing", "typing_extensions"):
            return f"annotation:{value!r}"  # ``int | None``, ``list[str]``: their repr is what they say
        if isinstance(value, enum.Enum):
            return f"enum:{self.value(kind, what)}.{value.name}"
        if isinstance(value, types.ModuleType):
            return self._module(value)
        if isinstance(value, types.FunctionType):
            return self._function(value, what)
        if isinstance(value, types.MethodType):
            return f"method:{self.value(value.__func__, what)}:{self.value(value.__self__, what)}"
        if isinstance(value, functools.partial):
            parts = [self.value(value.func, what), self.value(value.args, what), self.value(value.keywords, what)]
            return "partial:" + ",".join(parts)
        if isinstance(value, type):
            return self._class(value, what)
        fingerprint = getattr(kind, "__passkit_fingerprint__", None)
        if callable(fingerprint):  # a Pass read by another pass
            return f"passkit:{fingerprint(value)}"
        if (kind.__module__, kind.__qualname__) in _NAMED_BY_REPR:
            return f"{kind.__module__}.{kind.__qualname__}:{value!r}"
        named = self._by_name(value)
        if named is not None:  # a builtin function, or an object its module holds under its name
            return named
        if isinstance(value, tuple) and hasattr(kind, "_fields"):  # a named tuple
            return f"{self.value(kind, what)}{self.value(tuple(value), what)}"
        if dataclasses.is_dataclass(value):
            fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
            return f"{self.value(kind, what)}{self.value(fields, what)}"
        raise Unhashable(f"{what} is {_article(value)}, which passkit cannot hash")

    def _module(self, module: types.ModuleType) -> str:
        name = module.__name__
        path = getattr(module, "__file__", None)
        if installed(name) or not path:
            return f"module:{name}@{distribution_version(name)}"
        try:  # a local module (beside the notebook): its file is its code
            with open(path, "rb") as handle:
                return f"module:{name}:{hashlib.sha256(handle.read()).hexdigest()}"
        except OSError:
            raise Unhashable(f"the module {name!r} cannot be read from {path}") from None

    def _function(self, fn: types.FunctionType, what: str) -> str:
        if installed(fn.__module__ or ""):
            return f"function:{fn.__module__}.{fn.__qualname__}@{distribution_version(fn.__module__)}"
        of = "" if fn is self.root else f" of {fn.__qualname__}()"
        parts = [fn.__qualname__, self._code(fn.__code__), self.value(fn.__defaults__, what),
                 self.value(fn.__kwdefaults__, what), self.value(dict(fn.__annotations__), what)]
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:  # not yet assigned
                parts.append(f"{name}=<empty>")
                continue
            parts.append(f"{name}={self.value(contents, f'the closed-over name {name!r}{of}')}")
        builtins = fn.__builtins__
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                parts.append(f"{name}={self.value(fn.__globals__[name], f'the global {name!r}{of}')}")
            elif name not in builtins:
                parts.append(f"{name}=<unbound>")
        return "function:" + "|".join(parts)

    def _code(self, code: types.CodeType) -> str:
        consts = [self._code(c) if isinstance(c, types.CodeType) else self.value(c, "a constant") for c in code.co_consts]
        parts = [code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
                 code.co_code.hex(), code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                 getattr(code, "co_exceptiontable", b"").hex()]
        return "code(" + repr(parts) + ",[" + ",".join(consts) + "])"

    def _class(self, cls: type, what: str) -> str:
        if installed(cls.__module__):
            return f"class:{cls.__module__}.{cls.__qualname__}@{distribution_version(cls.__module__)}"
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            raise Unhashable(f"{what} is the class {cls.__qualname__}, whose source passkit cannot read") from None
        methods = []
        for name, attribute in sorted(vars(cls).items()):
            function = getattr(attribute, "__func__", attribute)  # classmethods, staticmethods
            if isinstance(function, types.FunctionType):
                methods.append(f"{name}={self._function(function, what)}")
        bases = ",".join(self.value(base, what) for base in cls.__bases__)
        return f"class:{cls.__qualname__}({bases}):{hashlib.sha256(source.encode()).hexdigest()}:{'|'.join(methods)}"

    def _by_name(self, value: Any) -> str | None:
        """``module.name`` when importing the object's module and looking its name up gives the
        object back, and the module is installed (a builtin function, ``math.pi``'s module...)."""
        module = getattr(value, "__module__", None)
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        if not isinstance(module, str) or not isinstance(name, str) or not installed(module):
            return None
        found: Any = sys.modules.get(module)
        for part in name.split("."):
            found = getattr(found, part, None)
        return f"object:{module}.{name}@{distribution_version(module)}" if found is value else None


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the functions, lambdas and comprehensions nested in it) loads."""
    names = {instruction.argval for instruction in dis.get_instructions(code) if instruction.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return {name for name in names if isinstance(name, str)}
