"""Own Inductor's inner compiler as ``codegen.inductor`` calls it: mode options, decomposition
tables, ``compile_fx_inner`` and the boxed callable it returns.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx import GraphModule, Node

from passkit._torch.inductor_cache import fakes_with_shape_env, static_input_specs
from passkit._torch.cpu_probes import cpu_probes_settled, start_cpu_probes
from passkit._torch.inductor_warm import GraphKey, graph_key_given, graph_key_of
from passkit._torch.hops import calls_higher_order, graph_and_subgraphs
from passkit._torch.region_calls import RegionCalls, compile_region_calls
from passkit._torch.tracing import BERNOULLI_IN_LAYOUT, fake_mode_of, new_fake_mode
from passkit._torch.own_decomps import reading_no_values

__all__ = [
    "DONATED_SUFFIX",
    "JOINT_PASSES_CONFIG",
    "backward_keeps_graph",
    "hide_bernoulli_fills",
    "inductor_callable",
    "import_inductor_compiler",
    "inductor_compile",
    "inductor_decompositions",
    "InductorPairState",
    "inductor_failed_toolchain",
    "inductor_lowering_decompositions",
    "inductor_joint_graph_passes",
    "inductor_native_random",
    "inductor_mode_options",
    "inductor_source",
    "mark_donated_inputs",
    "restride_fake",
]

# Appended to the name of each placeholder a backward may overwrite: Inductor's FX graph cache
# keys on the graph's code and not on the donation, so the name carries it into the key.
DONATED_SUFFIX = "_donated"


def inductor_mode_options(mode: str) -> dict[str, Any]:
    """The Inductor config that ``torch.compile(mode=...)`` applies for ``mode``."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode) or {})


@dataclasses.dataclass
class InductorPairState:
    """What a forward and its backward share while Inductor compiles them, as torch's
    ``compile_fx`` shares it: the CUDA device the forward ran on, and one cudagraphs switch.
    When the forward's graph cannot be recorded as a CUDA graph, the switch turns off for the
    backward too; a backward recorded alone would re-record every step (its saved inputs'
    addresses change), and one recorded without the forward's device trips Inductor's assert.
    """

    device_index: Any = dataclasses.field(init=False)
    cudagraphs: Any = dataclasses.field(init=False, default=None)  # made under the first graph's config

    def __post_init__(self) -> None:
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex

        self.device_index = BoxedDeviceIndex(None)

    def cudagraphs_box(self) -> Any:
        from torch._inductor import config as inductor_config
        from torch._inductor.utils import BoxedBool

        if self.cudagraphs is None:
            self.cudagraphs = BoxedBool(bool(inductor_config.triton.cudagraphs))
        return self.cudagraphs


def inductor_failed_toolchain(exc: BaseException) -> str | None:
    """Which kernel toolchain an Inductor failure came from: ``"C++ compiler"`` (g++ missing or
    failing), ``"Triton"`` (missing, or failing to compile a kernel), or None (a lowering or
    other failure, which no toolchain explains)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        name, module = type(error).__name__, type(error).__module__
        if name == "CUDACompileError" or name == "TritonMissing" or module.split(".")[0] == "triton":
            return "Triton"
        if name in ("CppCompileError", "InvalidCxxCompiler"):
            return "C++ compiler"
        pending += [getattr(error, "inner_exception", None), error.__cause__, error.__context__]
    return None


def import_inductor_compiler() -> None:
    """Import Inductor's compiler (seconds of imports), as ``torch.compile`` does when it is
    called: after it, the first graph, a cache hit's included, compiles without paying them.
    Its CPU probes start on another thread (``start_cpu_probes``)."""
    import torch._inductor.compile_fx  # noqa: F401

    start_cpu_probes()


def inductor_compile(
    gm: GraphModule,
    example_inputs: Sequence[Any],
    *,
    is_backward: bool,
    is_inference: bool,
    static_input_idxs: Sequence[int],
    user_visible_output_idxs: Sequence[int],
    config_patches: dict[str, Any],
    graph_id: int,
    pair_state: InductorPairState,
    donated: Sequence[int] = (),
    graph_key: GraphKey | list[GraphKey | None] | None = None,
    regions_from_python: bool = False,
) -> tuple[Callable[[list[Any]], Any], list[tuple[int, ...] | None] | None]:
    """Compile one functional ATen graph with Inductor's inner compiler (``compile_fx_inner``).

    ``gm`` is compiled in place (Inductor's post-grad passes rewrite it), so pass a copy. Returns
    the boxed callable (call it with a fresh list; it clears the list) and the strides Inductor
    chose for each output, which a backward compiled afterwards must be told about.
    ``donated`` lists a backward's inputs whose memory it may write its own buffers into (see
    ``mark_donated_inputs``); Inductor reads them from the tracing context, as torch's AOT
    hands them over. ``graph_key`` is the FX graph cache key an earlier compile of the same
    graph and inputs got (``graph_key_of``): Inductor looks it up without hashing again.
    ``regions_from_python`` compiles a graph that calls outlined regions as Python calling each
    distinct body compiled once (``compile_region_calls``), where it can be cut; its
    ``graph_key`` is then the list of its pieces' keys, in the order they compile.
    """
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    if regions_from_python:
        program = _compile_region_calls(gm, example_inputs, is_backward=is_backward, is_inference=is_inference,
                                        config_patches=config_patches, graph_id=graph_id, pair_state=pair_state,
                                        piece_keys=graph_key if isinstance(graph_key, list) else [], donated=donated)
        if program is not None:
            return program, program.output_strides
    if isinstance(graph_key, list):  # filed for the pieces of a graph that is now lowered whole
        graph_key = None
    if donated and calls_higher_order(gm, "invoke_subgraph"):
        # Inductor hands a graph's donated positions to every body it lowers in it, so a body
        # overwrote whichever of its own inputs sat at one (a gradient the graph still read).
        donated = []
    cpu_probes_settled()
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    # Only a Node has strides to keep: Inductor's padding pass (on for GPUs) dereferences every
    # visible output, and a backward's gradient for an operand that needs none is a None.
    results = output.args[0] if isinstance(output.args[0], (list, tuple)) else output.args
    output.meta["user_visible_output_idxs"] = [i for i in user_visible_output_idxs if isinstance(results[i], Node)]
    fake_mode = fake_mode_of(example_inputs) or new_fake_mode()
    if fake_mode.shape_env is None:  # Inductor's FX graph cache bypasses graphs without one
        specs = static_input_specs(example_inputs)
        if specs is not None:
            example_inputs = fakes_with_shape_env(specs)
            fake_mode = fake_mode_of(example_inputs) or fake_mode
    # A context of our own: inside a Dynamo backend the ambient one carries Dynamo's fake mode.
    context = TracingContext(fake_mode)
    if donated:
        context.fw_metadata = _Donation(bw_donated_idxs=list(donated))  # type: ignore[assignment]
    with inductor_config.patch(config_patches), tracing(context), graph_key_given(graph_key):
        with TracingContext.report_output_strides() as strides:
            compiled = compile_fx_inner(
                gm,
                list(example_inputs),
                static_input_idxs=list(static_input_idxs),
                cudagraphs=pair_state.cudagraphs_box(),
                is_backward=is_backward,
                is_inference=is_inference,
                graph_id=graph_id,
                boxed_forward_device_index=pair_state.device_index,
            )
    return compiled, (list(strides) if strides is not None else None)


def _compile_region_calls(gm: GraphModule, example_inputs: Sequence[Any], *, is_backward: bool, is_inference: bool,
                          config_patches: dict[str, Any], graph_id: int, pair_state: InductorPairState,
                          piece_keys: list[GraphKey | None], donated: Sequence[int]) -> RegionCalls | None:
    from torch._inductor import config as inductor_config

    with inductor_config.patch(config_patches):
        if inductor_config.triton.cudagraphs:  # one recorded graph needs the whole graph in Inductor
            return None

    filed: list[GraphKey | None] = []
    # Buffer reuse is off for a graph Inductor lowers with region results that share an operand's
    # memory (``region_results_alias_operands``); between Python calls no buffer outlives its piece.
    config_patches = {k: v for k, v in config_patches.items() if k != "allow_buffer_reuse"}

    def compile_piece(piece: GraphModule, examples: list[Any], writable: tuple[int, ...]) -> Any:
        outputs = next(n for n in reversed(piece.graph.nodes) if n.op == "output").args[0]
        mark_donated_inputs(piece, writable)
        compiled, _ = inductor_compile(
            piece, examples, is_backward=is_backward, is_inference=is_inference, static_input_idxs=[],
            user_visible_output_idxs=range(len(outputs)), config_patches=config_patches, graph_id=graph_id,
            pair_state=pair_state, graph_key=piece_keys[len(filed)] if len(filed) < len(piece_keys) else None,
            donated=writable,
        )
        filed.append(graph_key_of(compiled))
        return compiled

    program = compile_region_calls(gm, example_inputs, compile_piece, inductor_callable, inductor_source, donated)
    if program is not None:
        program.piece_keys = filed
    return program


@dataclasses.dataclass
class _Donation:
    """The one field of torch's AOT metadata that ``compile_fx_inner`` reads for a backward."""

    bw_donated_idxs: list[int]


# What ``inductor_joint_graph_passes`` sets over the user's Inductor config while it runs.
JOINT_PASSES_CONFIG: dict[str, Any] = {"fallback_random": True}


def inductor_joint_graph_passes(gm: GraphModule) -> GraphModule:
    """Run the passes ``torch.compile`` runs on a joint (or inference) graph before partitioning.

    Inductor's ``joint_graph_passes``: ATen canonicalization, no-op removal (never making an
    output alias an input), folding of tensors filled with one value, and its pattern matcher's
    joint patterns (pointless views and permutes, attention to SDPA, ...), each governed by
    Inductor's config as in ``torch.compile``. Random ops stay ATen's: ``codegen.inductor``'s
    ``fallback_random`` alone decides how they draw. Returns the graph module: ``gm`` changed in
    place, or on torch 2.13 possibly a new one.
    """
    import inspect

    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import _recursive_joint_graph_passes
    from torch._inductor.virtualized import V

    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    kwargs: dict[str, Any] = {}
    if "input_device" in inspect.signature(_recursive_joint_graph_passes).parameters:  # torch 2.13
        kwargs["input_device"] = next((v.device for v in values if isinstance(v, torch.Tensor)), None)
    # Replacements are traced under V.fake_mode; without it a pattern that makes a tensor
    # (``arange`` in the scatter-on-a-constant pattern) mixes a real tensor with fake ones.
    fake_mode = fake_mode_of(values) or new_fake_mode()
    with inductor_config.patch(JOINT_PASSES_CONFIG), tracing(TracingContext(fake_mode)), V.set_fake_mode(fake_mode):
        result = _recursive_joint_graph_passes(gm, **kwargs)
    return result if result is not None else gm  # torch 2.11 changes ``gm`` and returns None


def inductor_native_random(gm: GraphModule) -> bool:
    """Rewrite ``gm``'s ATen random ops (``rand``, ``randn``, ``rand_like``, ...) into Inductor's
    own seeded random, as ``torch.compile``'s joint passes do when ``fallback_random`` is off.

    Inductor's lowerings of those ops assume this ran: they raise "should have been handled in
    replace_random.py" otherwise. ``inductor_joint_graph_passes`` leaves random ops whole, so
    ``codegen.inductor`` runs this on the graph it lowers, its subgraphs (a ``cond`` branch)
    included. Returns whether it changed ``gm``.
    """
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._inductor.fx_passes.replace_random import replace_random_passes
    from torch._inductor.virtualized import V

    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = fake_mode_of(values) or new_fake_mode()
    changed = False
    with inductor_config.patch(fallback_random=False), tracing(TracingContext(fake_mode)), V.set_fake_mode(fake_mode):
        for graph in graph_and_subgraphs(gm):
            if replace_random_passes(graph):
                graph.recompile()
                changed = True
    return changed


def mark_donated_inputs(gm: GraphModule, donated: Sequence[int]) -> None:
    """Rename the placeholders at positions ``donated`` with ``DONATED_SUFFIX``.

    The generated code is then different from the same graph compiled without donation, so
    Inductor's FX graph cache never hands one the other's code: code that overwrites an input
    that its caller still reads is a silent wrong result.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k in donated:
        node = placeholders[k]
        if not node.name.endswith(DONATED_SUFFIX):
            node._rename(node.name + DONATED_SUFFIX)
            node.target = node.name
    gm.recompile()


def backward_keeps_graph() -> bool:
    """Whether the running backward keeps the graph (``retain_graph=True``): the saved tensors
    are then read again by a later backward and must not be overwritten."""
    return bool(torch._C._autograd._get_current_graph_task_keep_graph())


def hide_bernoulli_fills(gm: GraphModule, *, fallback_random: bool) -> bool:
    """Give Inductor each ``bernoulli.p`` it would run as ATen's in-place fill as one opaque op.

    Inductor lowers ``bernoulli.p(x, p)`` to a copy of ``x`` filled in place by ATen (always on
    the CPU; on CUDA under ``fallback_random``). Its scheduler can fuse the readers of the filled
    buffer into the kernel that makes the copy, before the fill runs: dropout after a layer norm
    then multiplies by uninitialized memory (torch 2.13, BERT's embeddings gave a NaN loss).
    ``passkit::bernoulli_in_layout`` draws the same numbers into a tensor of its own, which
    Inductor runs as a fallback kernel and orders like any other. Subgraphs (a ``cond`` branch)
    are lowered by the same scheduler, so their fills are hidden too. Returns whether it changed
    ``gm``.
    """
    changed = False
    for graph in graph_and_subgraphs(gm):
        hidden = False
        for node in graph.graph.nodes:
            if node.op != "call_function" or node.target is not torch.ops.aten.bernoulli.p:
                continue
            value = node.meta.get("val")
            on_cpu = isinstance(value, torch.Tensor) and value.device.type == "cpu"
            if node.kwargs.get("generator") is None and (fallback_random or on_cpu):
                p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
                node.target, node.args, node.kwargs = BERNOULLI_IN_LAYOUT, (node.args[0], p), {}
                hidden = True
        if hidden:
            graph.recompile()
        changed |= hidden
    return changed


def restride_fake(value: Any, stride: Sequence[int]) -> Any:
    """``value`` (a fake tensor) with the same size and offset and the given strides."""
    fake_mode = value.fake_mode
    with fake_mode:
        return torch.empty_strided(value.size(), tuple(stride), dtype=value.dtype, device=value.device)


@functools.cache
def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's whole decomposition table, as torch's AOT applies it before Inductor lowers.

    Some of its decompositions apply only to some inputs and return ``NotImplemented``
    otherwise (``mm`` on most CPU shapes, ``max_pool2d_with_indices_backward`` in deterministic
    mode); the op then stays for Inductor's own lowering (see ``ops.decomposition_may_decline``).
    Leaving those out costs speed: Inductor lowers ResNet's max-pool backward as a loop over
    every window that is eight times slower than the scatter the decomposition makes.
    """
    import torch._inductor.lowering  # noqa: F401 - some decompositions ask its lowerings
    from torch._inductor.decomposition import select_decomp_table

    return reading_no_values(dict(select_decomp_table()))


@functools.cache
def inductor_lowering_decompositions(fallback_random: bool) -> dict[Any, Callable[..., Any]]:
    """The table Inductor's lowerings expect under ``fallback_random``, as ``select_decomp_table``
    picks it under that config in ``torch.compile``.

    With ``fallback_random`` random ops stay whole, so Inductor runs ATen's own kernels and the
    draws equal eager's (CUDA's fused ``native_dropout`` included). Without it, torch's random
    decompositions turn dropout and ``bernoulli`` into ``rand`` comparisons on the GPU, which
    Inductor rewrites to its philox-seeded random (its ``bernoulli`` lowering refuses CUDA
    tensors there); on the CPU they decline and the ops stay.
    """
    import torch._inductor.lowering  # noqa: F401 - some decompositions ask its lowerings
    from torch._inductor import config as inductor_config
    from torch._inductor.decomposition import select_decomp_table

    with inductor_config.patch(fallback_random=fallback_random):
        return reading_no_values(dict(select_decomp_table()))


def inductor_callable(compiled: Any) -> Callable[[list[Any]], Any]:
    """The boxed function to call for a compiled graph: its generated code itself on the CPU.

    ``CompiledFxGraph.__call__`` enters autotune-cache and metrics contexts on every call, which
    only matter for GPU kernels; CPU-only graphs skip that per-call work.
    """
    direct = getattr(compiled, "current_callable", None)
    device_types = set(getattr(compiled, "device_types", ()) or ())
    if direct is not None and device_types <= {"cpu"}:
        return direct
    return compiled


def inductor_source(compiled: Any) -> str | None:
    """The Python module Inductor generated for a compiled graph (its kernels inline)."""
    source = getattr(compiled, "source_code", None)
    return source if isinstance(source, str) else None
