"""Own the pass abstraction: ``Pass``, the ``graph_pass`` decorator, options models, fingerprints.

A pass is a named, documented transform ``(program, **options) -> changed?`` with a contract
over facts (``requires``, ``produces``, ``invalidates``). Its options are its keyword-only
parameters; passkit builds a strict pydantic model from their annotations and defaults, or the
pass gives ``options=SomeModel``. The fingerprint (name, version, a hash of the source file of the
pass's module and the version of the distribution that ships it) feeds the compile cache key, so
editing a plugin invalidates its entries and pass authors never write a ``uuid()``;
``passkit_source_digest`` fingerprints passkit's own files for the same key. A pass that
is approximate by design (a tanh GELU) declares ``tolerance=(rtol, atol)``, or a function of its
options returning one (``rewrite``: the loosest of the pattern sets it applies): numerics checks
of a pipeline that runs it accept that much difference.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
import textwrap
import types
import typing
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable

import pydantic

from passkit.core.code_digest import Unhashable, code_digest, distribution_version, installed

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext
    from passkit.core.program import Program
    from passkit.core.registry import Registry

__all__ = ["Pass", "graph_pass", "PASS_NAME_RE"]

CONTEXT = "context"  # the keyword-only parameter through which a pass receives its StepContext
PASS_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


class _StrictOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


@dataclass(frozen=True, eq=False)
class Pass:
    """A registered transform. Build one with :func:`graph_pass`."""

    name: str
    fn: Callable[..., Any]
    options_model: type[pydantic.BaseModel]
    requires: frozenset[str] = frozenset()
    produces: frozenset[str] = frozenset()
    invalidates: frozenset[str] = frozenset()
    training_only: bool = False
    version: str = "1"
    doc: str = ""
    # (rtol, atol) this pass's results may differ by, or ``f(options) -> (rtol, atol) | None``.
    tolerance: tuple[float, float] | Callable[[Any], tuple[float, float] | None] | None = None
    takes_context: bool = False  # the function has a keyword-only ``context`` (the StepContext)
    # State outside the program and the options that decides the output (a code generator's
    # global config): ``cache_context(options) -> str`` joins the compile cache key.
    cache_context: Callable[[Any], str] | None = None
    # Work the pass needs before its first run, done once when a backend is built (as
    # ``torch.compile`` imports Inductor then), so a warm restart's first step does not pay it.
    prepare: Callable[[], None] | None = None

    @property
    def summary(self) -> str:
        """First line of the docstring: what ``passkit passes`` shows."""
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    def declared_tolerance(self, options: pydantic.BaseModel | None = None) -> tuple[float, float] | None:
        """The ``(rtol, atol)`` this pass declares when run with ``options`` (default options when
        None), or None when it keeps eager's numerics."""
        if not callable(self.tolerance):
            return self.tolerance
        declared = self.tolerance(options if options is not None else self.options())
        return None if declared is None else _checked_tolerance(self.name, declared)

    def options(self, *, registry: Registry | None = None, **values: Any) -> pydantic.BaseModel:
        """Validate option values against this pass's model.

        Options that name registered things (decomposition tables, pattern sets) are checked
        against ``registry``, which validators read from pydantic's validation context
        (``info.context["registry"]``).
        """
        return self.options_model.model_validate(values, context={"registry": registry})

    def run(self, program: Program, options: pydantic.BaseModel | None = None, *, context: StepContext | None = None) -> bool:
        """Apply the pass; returns what the pass claims (the runner judges change by hashes).

        A pass whose function takes a keyword-only ``context`` gets the step's ``StepContext``
        (None outside a pipeline), for example to ask ``context.should_apply`` before each rewrite.
        """
        opts = options if options is not None else self.options()
        extra = {"context": context} if self.takes_context else {}
        return bool(self.fn(program, **dict(opts), **extra))

    def fingerprint(self, *, by_value: bool = False) -> str:
        """Stable identity of this pass's behaviour: name, version, the hash of its module's
        source file and the version of the distribution that ships it.

        Hashing the whole file (not just the function) catches edits to the helpers a pass
        calls; the distribution version catches changes elsewhere in an installed plugin.

        ``by_value`` (a pass no plugin registered, handed over as an object): its contract, its
        code and the values it reads instead (``passkit.core.code_digest``), so editing the pass
        in a notebook, or a value it closes over, changes the fingerprint. When such a value
        cannot be hashed (``by_value_problem`` says which), each call returns a fresh one, so
        nothing compiled with it is ever reused.
        """
        if by_value:
            try:
                return self._value_fingerprint()
            except Unhashable:
                return f"{self.name}@{self.version}:unhashable:{uuid.uuid4().hex}"
        module = getattr(self.fn, "__module__", None) or ""
        tolerance = getattr(self.tolerance, "__qualname__", None) if callable(self.tolerance) else repr(self.tolerance)
        parts = [self.name, self.version, str(tolerance), _source_digest(self.fn), distribution_version(module)]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
        return f"{self.name}@{self.version}:{digest[:16]}"

    def by_value_problem(self) -> str | None:
        """Why this pass cannot be fingerprinted by value (a value it reads that passkit cannot
        hash, such as a tensor), or None when it can."""
        try:
            self._value_fingerprint()
        except Unhashable as exc:
            return str(exc)
        return None

    def _value_fingerprint(self) -> str:
        contract = [sorted(self.requires), sorted(self.produces), sorted(self.invalidates), self.training_only]
        parts = [self.name, self.version, repr(contract), code_digest(self.fn, "the pass"),
                 code_digest(self.options_model, "its options model"), code_digest(self.tolerance, "its tolerance"),
                 code_digest(self.cache_context, "its cache_context"), code_digest(self.prepare, "its prepare")]
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
        return f"{self.name}@{self.version}:value:{digest[:16]}"

    def __passkit_fingerprint__(self) -> str:
        """How a pass another unregistered pass reads is hashed: by value unless installed."""
        return self._value_fingerprint() if not installed(getattr(self.fn, "__module__", "") or "") else self.fingerprint()

    def option_fields(self) -> list[dict[str, Any]]:
        """Each option's name, type and default, for listings."""
        rows = []
        for key, info in self.options_model.model_fields.items():
            annotation = info.annotation
            generic = typing.get_origin(annotation) is not None
            type_name = (None if generic else getattr(annotation, "__name__", None)) or str(annotation).replace("typing.", "")
            default = None if info.is_required() else info.get_default(call_default_factory=True)
            rows.append({"name": key, "type": type_name, "default": default, "required": info.is_required()})
        return rows

    def __call__(self, program: Program, **options: Any) -> bool:
        return self.run(program, self.options(**options))

    def __repr__(self) -> str:
        return f"<Pass {self.name}>"


def _checked_tolerance(name: str, tolerance: Any) -> tuple[float, float]:
    """``tolerance`` as a pair of floats; ValueError unless it is ``(rtol, atol)``, both >= 0."""
    try:
        rtol, atol = (float(value) for value in tolerance)
    except (TypeError, ValueError):
        rtol = atol = -1.0
    if min(rtol, atol) < 0:
        raise ValueError(f"pass {name!r}: tolerance must be (rtol, atol), both >= 0, not {tolerance!r}")
    return (rtol, atol)


def _source_digest(fn: Callable[..., Any]) -> str:
    """sha256 of the source file that defines ``fn`` (its own source when there is no file)."""
    try:
        path = _source_file(fn)
        if path:
            return _passkit_file_digests().get(_inside_passkit(path), "") or _file_digest(path)
    except (OSError, TypeError):
        pass
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = getattr(fn, "__qualname__", repr(fn))
    return hashlib.sha256(source.encode()).hexdigest()


def _source_file(fn: Callable[..., Any]) -> str | None:
    """``inspect.getsourcefile``, once per function: it looks for the file on disk (a dozen
    ``stat`` calls), and every compile fingerprints each of its steps' passes. The file's
    contents are still read on each call (``_file_digest``), so an edited plugin is noticed."""
    try:
        return _cached_source_file(fn)
    except TypeError:  # an unhashable callable object; or no source file at all, raised again below
        return inspect.getsourcefile(fn)


_cached_source_file = functools.lru_cache(maxsize=1024)(inspect.getsourcefile)


def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return "unreadable:" + path


PASSKIT_ROOT = Path(__file__).resolve().parents[1]  # passkit/, above core/


def passkit_source_digest() -> str:
    """sha256 over passkit's own files (every ``passkit/**/*.py`` and shipped pipeline file,
    by path and content), read once per process: the compile cache keys on it, so an upgrade
    or a local edit of passkit's runtime, capture or built-in passes never serves an entry
    compiled by other code. Built-in passes' fingerprints read their files from the same table."""
    digests = _passkit_file_digests()
    return hashlib.sha256("\n".join(f"{path}={digest}" for path, digest in sorted(digests.items())).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _passkit_file_digests() -> dict[str, str]:
    files = [*PASSKIT_ROOT.rglob("*.py"), *(PASSKIT_ROOT / "pipelines").glob("*.toml")]
    return {path.relative_to(PASSKIT_ROOT).as_posix(): _file_digest(str(path)) for path in files}


@functools.lru_cache(maxsize=1024)
def _inside_passkit(path: str) -> str:
    """``path`` relative to the passkit package ("" when it is outside); once per path, since
    resolving it reads every folder on the way, for each step of every compile."""
    try:
        return Path(path).resolve().relative_to(PASSKIT_ROOT).as_posix()
    except ValueError:
        return ""


def _options_from_signature(name: str, fn: Callable[..., Any]) -> type[pydantic.BaseModel]:
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise TypeError(f"pass {name!r}: the first parameter must be the program")
    hints = _resolved_hints(fn)
    fields: dict[str, Any] = {}
    for param in params[1:]:
        if param.name == CONTEXT and param.kind is param.KEYWORD_ONLY:
            continue
        if param.kind is not param.KEYWORD_ONLY:
            raise TypeError(f"pass {name!r}: option {param.name!r} must be keyword-only (put it after '*')")
        annotation = _strict_scalars(hints.get(param.name, Any))
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model_name = "".join(part.title() for part in re.split(r"[._]", name)) + "Options"
    return pydantic.create_model(model_name, __base__=_StrictOptions, **fields)


_SCALARS = (bool, int, float, str)


def _strict_scalars(annotation: Any) -> Any:
    """``annotation`` with its scalar types strict: ``true`` is no ``int`` and ``"5"`` no number
    (an ``int`` still fills a ``float``). Containers keep pydantic's conversions, so a TOML
    array fills a ``tuple`` option."""
    if annotation in _SCALARS:
        return Annotated[annotation, pydantic.Strict()]
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        if all(arg in _SCALARS or arg is type(None) for arg in args):
            return typing.Union[tuple(_strict_scalars(arg) for arg in args)]  # type: ignore[return-value]
    return annotation


def _takes_context(fn: Callable[..., Any]) -> bool:
    parameter = inspect.signature(fn).parameters.get(CONTEXT)
    return parameter is not None and parameter.kind is parameter.KEYWORD_ONLY


def _resolved_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolved forward references: fall back to raw annotations
        return {k: (Any if isinstance(v, str) else v) for k, v in getattr(fn, "__annotations__", {}).items()}


def graph_pass(
    name: str,
    *,
    requires: Iterable[str] = (),
    produces: Iterable[str] = (),
    invalidates: Iterable[str] = (),
    options: type[pydantic.BaseModel] | None = None,
    training_only: bool = False,
    version: str = "1",
    tolerance: tuple[float, float] | Callable[[Any], tuple[float, float] | None] | None = None,
    cache_context: Callable[[Any], str] | None = None,
    prepare: Callable[[], None] | None = None,
) -> Callable[[Callable[..., Any]], Pass]:
    """Declare a pass. Its keyword-only parameters become its options.

    Example::

        @passkit.graph_pass("acme.fold_double_neg", requires={"functional"})
        def fold_double_neg(program, *, max_rewrites: int = 100) -> bool:
            "Rewrite neg(neg(x)) to x."
            ...

    ``tolerance=(rtol, atol)`` declares how far the pass's results may be from eager's (an
    approximation by design); numerics checks of a pipeline that runs it use at least that.
    ``tolerance=f`` declares it per step: ``f(options)`` returns a pair, or None for none.
    ``cache_context(options) -> str`` names state outside the program and options that changes
    the pass's output (``codegen.inductor``: Inductor's global config); the compile cache key
    includes it, read at each compile. ``prepare()`` does once, when ``passkit.compile`` or
    ``passkit.backend`` is called, work the pass needs before its first run (``codegen.inductor``
    imports Inductor's compiler then, as ``torch.compile`` does, not inside the first step).
    """
    if not PASS_NAME_RE.match(name):
        raise ValueError(f"invalid pass name {name!r}: use lowercase dotted words such as 'acme.fold_neg'")
    if tolerance is not None and not callable(tolerance):
        tolerance = _checked_tolerance(name, tolerance)

    def decorate(fn: Callable[..., Any]) -> Pass:
        if options is not None:
            model = options
        else:
            model = _options_from_signature(name, fn)
        return Pass(
            name=name,
            fn=fn,
            options_model=model,
            requires=frozenset(requires),
            produces=frozenset(produces),
            invalidates=frozenset(invalidates),
            training_only=training_only,
            version=version,
            doc=textwrap.dedent(fn.__doc__ or ""),
            tolerance=tolerance,
            takes_context=_takes_context(fn),
            cache_context=cache_context,
            prepare=prepare,
        )

    return decorate
