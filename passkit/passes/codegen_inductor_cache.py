"""Own the compile-cache form of ``codegen.inductor``'s compiled graphs.

A compiled Inductor graph holds generated modules and kernels that do not pickle. What does is
what Inductor was given: the graph (after passkit's stages and ``codegen.inductor``'s own
preparation), the sizes, strides and dtypes of its inputs, and the arguments of the inner
compile. That is an ``InductorRecipe``; each compiled callable carries one through
``passkit_cache_payload()`` (see ``passkit.cache.store``).

On a hit, ``load`` runs Inductor's inner compiler on the stored graph again, and none of
passkit's stages. The inputs are rebuilt as fake tensors in a fake mode with a shape
environment, exactly as the first compile made them, so Inductor's own FX graph cache finds
the code it generated then (the cache of ``torch.compile``, under ``TORCHINDUCTOR_CACHE_DIR``)
and generates nothing again. The recipe carries the files that folder held for the graph
(``built``: its FX graph cache entry and kernel libraries, ``_torch.built_files``), written back
where a folder lacks them, so another machine loads without lowering or building; where they
cannot be, Inductor compiles the same graph again.
The recipe keeps the key Inductor filed the graph under, so the reload does not hash the graph
to find it (``_torch.graph_key_given``).

What the recipe does not cover is Inductor's global config: the compile cache key includes its
digest (``codegen.inductor``'s ``cache_context``), so an entry is only used under the config
that produced it (the stored backward input strides depend on the forward Inductor chose).

The graph is stored as data (``_torch.graph_data``: each node's name, target by name and
arguments), not pickled: unpickling a graph module retraces its code, which renames nodes and
turns factory calls into constants, and Inductor's cache keys on the code. A graph whose input
sizes are symbolic keeps its inputs as the fake values themselves (``symbolic``): the compile
cache pickles them with their shape environment, so the reloaded inputs carry the same symbols
and hints and Inductor's FX graph cache finds the symbolic code it generated. The bodies of
outlined regions (graph modules the graph reads with ``get_attr`` and calls through
``invoke_subgraph``) are stored the same way, under their attribute names, and must rebuild to
the code Inductor compiled too (``codes``). A graph is left uncached (the program then compiles
every time) when it or a body calls something that cannot be found again by name, or when
either does not rebuild to the same code.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from torch.fx import GraphModule

from passkit import _torch
from passkit.passes import codegen_inductor_calls as calls

__all__ = ["InductorRecipe", "snapshot", "cacheable", "load", "LOADER"]

FORMAT = 6  # 6: ``built``
LOADER = "passkit.passes.codegen_inductor_cache:load"
Wrapper = Literal["boxed", "no_grad", "strides_of"]

# A forward and its backward share a graph id and a device box (cudagraphs); loading sets the
# pair up again in the order ``program.compiled`` lists them, forward first.
_pairs: dict[tuple[str, int], tuple[int, Any]] = {}
_pairs_lock = threading.Lock()


@dataclass(frozen=True)
class InductorRecipe:
    """What Inductor's inner compiler was given for one graph, in picklable form."""

    graph: dict[str, Any]  # ``_torch.graph_data`` of the graph before Inductor rewrote it
    codes: dict[str, str]  # its code and its region bodies' (``_torch.graph_codes``): Inductor's FX graph cache keys on them
    inputs: list[Any]  # ``_torch.static_input_specs`` of the example inputs, or the fakes themselves when symbolic
    is_backward: bool
    is_inference: bool
    static: list[int]
    visible: list[int]
    config_patches: dict[str, Any]
    pair: str  # shared by a forward and its backward
    wrapper: Wrapper = "boxed"
    check: list[int] = dataclasses.field(default_factory=list)  # ``strides_of``: inputs to restride
    written: list[int] = dataclasses.field(default_factory=list)  # mutation slots the graph writes itself
    donated: list[int] = dataclasses.field(default_factory=list)  # inputs a backward may overwrite
    bundle_kernels: bool = True  # its C++ kernels built as a few libraries (found again under the same names)
    symbolic: bool = False  # ``inputs`` are fake values with symbolic sizes (pickled with their shape environment)
    graph_key: Any = None  # Inductor's FX graph cache key for it, or its pieces' (``_torch.graph_key_of``)
    regions_from_python: bool = False  # ``region_calls = "python"``: its region calls cut out (``_torch.compile_region_calls``)
    built: dict[str, bytes] | None = None  # the files Inductor's folder held for it (``_torch.built_files``)
    format: int = FORMAT
    # Reads ``built`` once the kernels are bound, when an entry is written; never stored.
    find_built: Callable[[], dict[str, bytes] | None] | None = dataclasses.field(default=None, compare=False, repr=False)


def snapshot(graph: GraphModule, examples: Sequence[Any], *, is_backward: bool, is_inference: bool,
             static: Sequence[int], visible: Sequence[int], config_patches: dict[str, Any],
             pair: str | None = None, donated: Sequence[int] = (), bundle_kernels: bool = True,
             regions_from_python: bool = False) -> InductorRecipe | None:
    """The recipe for compiling ``graph`` (call before Inductor rewrites it), or None when it
    cannot be stored faithfully."""
    specs = _torch.static_input_specs(examples)
    symbolic = specs is None
    if symbolic:
        specs = _torch.symbolic_inputs(examples)
        if specs is None:
            return None
    data = _torch.graph_data(graph)
    if data is None:
        return None
    return InductorRecipe(
        graph=data, codes=_torch.graph_codes(graph), inputs=specs, is_backward=is_backward, is_inference=is_inference,
        static=list(static), visible=list(visible), config_patches=dict(config_patches),
        pair=pair or uuid.uuid4().hex, donated=list(donated), bundle_kernels=bundle_kernels,
        symbolic=symbolic, regions_from_python=regions_from_python,
    )


def filed_under(recipe: InductorRecipe | None, compiled: Any) -> InductorRecipe | None:
    """``recipe`` with the FX graph cache key Inductor filed ``compiled`` under, which a reload
    hands back instead of hashing the graph again, and the files a reload on another machine needs."""
    if recipe is None:
        return None
    graph_key = _torch.graph_key_of(compiled)
    return dataclasses.replace(recipe, graph_key=graph_key, find_built=functools.partial(_torch.built_files, compiled, graph_key))


def new_pair() -> str:
    """The id that ties a forward's recipe to its backward's."""
    return uuid.uuid4().hex


def cacheable(fn: Callable[..., Any], recipe: InductorRecipe | None, wrapper: Wrapper,
              check: Sequence[int] = (), written: Sequence[int] = ()) -> Callable[..., Any]:
    """``fn`` (the wrapped compiled graph), given the cache form of ``recipe`` if there is one."""
    if recipe is None:
        return fn
    stored = dataclasses.replace(recipe, wrapper=wrapper, check=list(check), written=list(written))
    try:
        fn.passkit_cache_payload = functools.partial(_payload, stored)  # type: ignore[attr-defined]
    except AttributeError:  # a callable that takes no attributes stays uncached
        pass
    return fn


def _payload(recipe: InductorRecipe) -> tuple[str, InductorRecipe] | None:
    """What the compile cache stores; None (compile every time) unless the graph and each of
    its region bodies reload to the code Inductor compiled. Checked only when an entry is written."""
    if recipe.find_built is not None:
        recipe = dataclasses.replace(recipe, built=recipe.find_built(), find_built=None)
    try:
        if _torch.graph_codes(_torch.graph_from_data(recipe.graph)) != recipe.codes:
            return None
    except Exception:  # noqa: BLE001 - a graph that does not reload is not stored
        return None
    return LOADER, recipe


def _graph_id_and_device(recipe: InductorRecipe) -> tuple[int, Any]:
    key = (recipe.pair, threading.get_ident())
    with _pairs_lock:
        if recipe.is_backward and key in _pairs:
            return _pairs.pop(key)
        found = (next(calls.graph_ids), _torch.InductorPairState())
        if not recipe.is_backward and not recipe.is_inference:
            _pairs[key] = found
        return found


def load(recipe: InductorRecipe) -> Callable[..., Any]:
    """Compile a stored graph again (Inductor's FX graph cache usually answers) and wrap it as
    ``codegen.inductor`` did; any failure makes the compile cache drop the entry."""
    if not isinstance(recipe, InductorRecipe) or recipe.format != FORMAT:
        raise ValueError("written by another version of codegen.inductor")
    graph = _torch.graph_from_data(recipe.graph)
    if _torch.graph_codes(graph) != recipe.codes:
        raise ValueError("the stored graph reloads to other code")
    examples = list(recipe.inputs) if recipe.symbolic else _torch.fakes_with_shape_env(recipe.inputs)
    graph_id, pair_state = _graph_id_and_device(recipe)
    device_type = calls.device_type(examples) or "cpu"
    with _torch.built_files_installed(recipe.built), \
            _torch.kernels_compiled_together(bundle=recipe.bundle_kernels, device_type=device_type):
        compiled, _ = _torch.inductor_compile(
            graph, examples, is_backward=recipe.is_backward, is_inference=recipe.is_inference,
            static_input_idxs=recipe.static, user_visible_output_idxs=recipe.visible,
            config_patches=recipe.config_patches, graph_id=graph_id, pair_state=pair_state,
            donated=recipe.donated, graph_key=recipe.graph_key, regions_from_python=recipe.regions_from_python,
        )
    fn = _torch.inductor_callable(compiled)
    if recipe.wrapper == "strides_of":
        wrapped = calls.backward_call(fn, examples, recipe.check, recipe.donated)
    elif recipe.wrapper == "no_grad":
        wrapped = calls.no_grad_boxed(fn, recipe.written)
    else:
        wrapped = calls.boxed(fn, recipe.written)
    wrapped = calls.with_source(wrapped, _torch.inductor_source(compiled))
    return cacheable(wrapped, recipe, recipe.wrapper, recipe.check, recipe.written)
