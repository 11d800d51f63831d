"""Own ``codegen.inductor``: compile every graph with Inductor's inner compiler.

passkit's own stages have already functionalized, decomposed, differentiated and partitioned the
program, so each graph (``forward`` and ``backward``, or ``main`` for inference) goes straight to
``compile_fx_inner``: torch's AOT pipeline is not run again. Inductor fuses pointwise and
reduction ops into C++ (CPU) or Triton (CUDA) kernels and runs the rest as ATen calls.

What the runtime wrapper relies on, and how it is kept:

- the forward is compiled first; where Inductor picks other strides for a saved value than the
  trace had (channels-last for convolutions), the backward is compiled for the strides it
  really receives, as torch's AOT does;
- parameters and buffers are static inputs of the forward, saved values of the backward;
- user outputs and gradients keep eager's strides;
- Inductor's code asserts the strides of its inputs, so a gradient that autograd hands over in
  another layout (an expanded ``ones`` from ``sum().backward()``) is copied to the traced one;
- each compiled graph is called boxed, with a fresh list per call (the generated code frees
  inputs from the list as soon as it can);
- a mutated buffer (BatchNorm's running statistics), and in an inference graph any input
  written under ``no_grad`` (a compiled optimizer step's parameters and state), is written by
  the graph itself, in the kernel that computes it, as torch's AOT keeps such mutations in the
  graph; its output slot then holds ``None`` and the runtime writes nothing back there;
- each compiled callable carries what Inductor was given (``codegen_inductor_cache``), so the
  compile cache can store it; a later process compiles the stored graphs again and Inductor's
  FX graph cache, which static graphs now reach, answers with the code generated the first time.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Literal, Sequence

import pydantic
import torch
from torch.fx import Graph, GraphModule, Node

from passkit import _torch

from passkit.core import progress
from passkit.errors import PassError
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.passes import codegen_inductor_cache as cache_form
from passkit.passes import codegen_inductor_calls as calls
from passkit.passes import codegen_inductor_memory as memory
from passkit.core.program import Program

__all__ = ["codegen_inductor", "InductorOptions", "inductor_fallback_message"]

Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
RegionCallMode = Literal["python", "inductor"]


class InductorOptions(pydantic.BaseModel):
    """Options of ``codegen.inductor``: a ``torch.compile`` mode and a few Inductor settings."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    mode: Mode = "default"
    """The Inductor settings ``torch.compile(mode=...)`` uses; cudagraphs only act on CUDA."""
    fallback_random: bool = False
    """Draw random numbers (dropout) with ATen's generator, so they equal eager's; slower."""
    epilogue_fusion: bool = True
    """Fuse pointwise ops into the epilogue of matmul and convolution templates."""
    cpp_threads: int | None = pydantic.Field(default=None, ge=1)
    """Threads of the generated C++ kernels (default: torch.get_num_threads())."""
    size_asserts: bool = True
    """Check each input's size and strides on every call (a few microseconds per graph)."""
    donate_saved: bool = True
    """Let the backward write into saved activations that nothing else reads (fewer allocations,
    a lower peak); a backward with ``retain_graph=True`` gets copies of them. Where a backward
    calls outlined regions, each call may write into the saved values it is the last to read
    (``region_calls = "python"``); lowered whole, it donates nothing (Inductor would let the
    bodies overwrite inputs the graph still reads)."""
    bundle_kernels: bool = True
    """Build each graph's C++ kernels as a few shared libraries, one per compile worker at most,
    instead of one library per kernel: the same code for a fraction of g++'s time (each library
    loads a 150 MB precompiled header and links against libtorch once)."""
    region_calls: RegionCallMode = "python"
    """How a graph calls the bodies of its outlined regions (``regions``): ``python`` compiles each
    distinct body, and each run of other ops between the calls, once on its own and calls them
    from a small Python graph, so compile time does not grow with the number of calls;
    ``inductor`` has Inductor lower the whole graph, which writes code for every call
    (docs/regions.md). A graph that cannot be cut (an input it mutates, symbolic sizes,
    cudagraphs) is lowered whole either way."""

    def config_patches(self) -> dict[str, Any]:
        patches = _torch.inductor_mode_options(self.mode) if self.mode != "default" else {}
        patches.update(fallback_random=self.fallback_random, epilogue_fusion=self.epilogue_fusion,
                       size_asserts=self.size_asserts)
        if self.cpp_threads is not None:
            patches["cpp.threads"] = self.cpp_threads
        return patches


def inductor_fallback_message(graph: str, training: bool, exc: BaseException, *, building_on: str | None = None) -> str:
    """The one-line error when Inductor cannot compile a graph, naming the pipeline to use.

    The advice names the toolchain that failed: the C++ compiler, Triton, or neither (a
    lowering failure). ``building_on`` is the device type whose kernels were being built when
    the failure carries no toolchain of its own (a build error surfacing from a worker).
    """
    fallback = "training-python" if training else "inference-python"
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    toolchain = _torch.inductor_failed_toolchain(exc) or _KERNEL_TOOLCHAIN.get(building_on or "")
    without = f"needs no {toolchain}" if toolchain else "runs the graph as ATen calls, without Inductor"
    return f"Inductor cannot compile the '{graph}' graph ({reason}); use the '{fallback}' pipeline, which {without}"


_KERNEL_TOOLCHAIN = {"cpu": "C++ compiler", "cuda": "Triton", "xpu": "Triton"}


def _graph_for_inductor(gm: GraphModule, options: InductorOptions) -> GraphModule:
    """A copy of ``gm`` (Inductor's post-grad passes rewrite the graph they get) in its opset.

    Inductor's lowerings assume its decompositions ran. A pipeline that kept ops whole
    (``training-python``'s layer norm) gets them lowered here, by one more trace; the
    ``inductor`` table in a ``decompose`` step does it earlier and cheaper. Where ``full``'s
    decomposition declined, its lowering still needs the dtype, filled in from the traced
    value. Dropout's ``bernoulli.p`` becomes an op Inductor
    cannot mis-order (``_torch.hide_bernoulli_fills``). The table follows ``fallback_random``
    as ``torch.compile``'s does (``_torch.inductor_lowering_decompositions``): eager's draws
    from ATen's random kernels, or Inductor's own seeded random (``rand`` and ``randn`` become
    it here, as torch's joint passes make them: Inductor cannot lower them otherwise).
    """
    table = _torch.inductor_lowering_decompositions(options.fallback_random)
    # An op whose decomposition may decline is no sign of a kept op: it likely declined already.
    # Random ops off the CPU are the exception: their decompositions decline on the CPU alone.
    # Outlined regions' bodies count too: Inductor lowers them as it lowers the graph.
    if any(n.op == "call_function" and n.target in table
           and (not _torch.decomposition_may_decline(table[n.target]) or _draws_off_cpu(n))
           for graph_module in _torch.graph_and_subgraphs(gm) for n in graph_module.graph.nodes):
        copy = _torch.retrace(gm, decompositions=table, functional=False)
        if _torch.has_mutations(copy):
            copy = _torch.retrace(gm, decompositions=table, functional=True)
    else:
        graph = Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        copy = GraphModule(gm, graph)
    typed_fills = False
    for node in copy.graph.nodes:
        if node.target is torch.ops.aten.full.default and node.kwargs.get("dtype") is None:
            node.kwargs = {**node.kwargs, "dtype": node.meta["val"].dtype}
            typed_fills = True
    if typed_fills:  # else its code is already current (a deep graph's code takes a while to write)
        copy.recompile()
    _torch.hide_bernoulli_fills(copy, fallback_random=options.fallback_random)
    if not options.fallback_random:
        _torch.inductor_native_random(copy)
    return copy


def _draws_off_cpu(node: Node) -> bool:
    value = node.meta.get("val")
    return _torch.draws_random_numbers(node.target) and isinstance(value, torch.Tensor) and value.device.type != "cpu"


def _placeholder_values(gm: GraphModule) -> list[Any]:
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def _compile(program: Program, name: str, examples: list[Any], options: InductorOptions, *,
             is_backward: bool, is_inference: bool, static: list[int], visible: list[int],
             graph_id: int, pair_state: Any, pair: str = "", written: dict[int, int] | None = None,
             donated: Sequence[int] = (),
             ) -> tuple[Callable[[list[Any]], Any], Any, cache_form.InductorRecipe | None, str | None]:
    graph = _graph_for_inductor(program.graphs[name], options)
    if written:
        memory.write_mutations_in_graph(graph, written)
    if donated:
        _torch.mark_donated_inputs(graph, donated)
    config_patches = {**options.config_patches(), **_region_config(graph), **_draw_order_config(graph, options),
                      **_collective_order_config(graph)}
    regions_from_python = options.region_calls == "python"
    recipe = cache_form.snapshot(graph, examples, is_backward=is_backward, is_inference=is_inference, static=static,
                                 visible=visible, config_patches=config_patches, pair=pair, donated=donated,
                                 bundle_kernels=options.bundle_kernels, regions_from_python=regions_from_python)
    try:
        compiled, strides = _torch.inductor_compile(
            graph,
            examples,
            is_backward=is_backward,
            is_inference=is_inference,
            static_input_idxs=static,
            user_visible_output_idxs=visible,
            config_patches=config_patches,
            graph_id=graph_id,
            pair_state=pair_state,
            donated=donated,
            regions_from_python=regions_from_python,
        )
    except Exception as exc:  # noqa: BLE001 - any Inductor failure becomes the one-line fallback error
        raise PassError(inductor_fallback_message(name, program.training, exc)) from exc
    recipe = cache_form.filed_under(recipe, compiled)
    if donated and (isinstance(compiled, _torch.RegionCalls) or not _torch.calls_higher_order(program.graphs[name], "invoke_subgraph")):
        program.record_stat("donated_saved", len(donated))  # a graph Inductor lowered with its regions donates none
    if isinstance(compiled, _torch.RegionCalls):
        program.record_stat("graphs_calling_bodies", program.stats.get("graphs_calling_bodies", 0) + 1)
        program.record_stat("bodies_compiled", program.stats.get("bodies_compiled", 0) + compiled.bodies)
        program.record_stat("runs_compiled", program.stats.get("runs_compiled", 0) + compiled.compiled_runs)
    return _torch.inductor_callable(compiled), strides, recipe, _torch.inductor_source(compiled)


def _draw_order_config(graph: GraphModule, options: InductorOptions) -> dict[str, Any]:
    """Inductor settings that keep a graph's random draws in the graph's order.

    A random op that Inductor runs as ATen's kernel (always on the CPU, everywhere under
    ``fallback_random``) draws from the one global generator, so the order of two draws decides
    which mask each gets. Inductor's reorderings may move one draw past another: for peak
    memory in its scheduler (torch 2.11 and 2.13), and for locality after its post-grad passes
    (2.11; 2.13 keeps random ops in place there). torch 2.11 moved one of GPT-2's dropouts past
    another, and its loss differed from eager's by 3e-3. A graph with two draws or more is
    compiled without those reorderings; its numbers are eager's.
    """
    draws = [n for gm in _torch.graph_and_subgraphs(graph) for n in gm.graph.nodes
             if n.op == "call_function" and n.target is not operator.getitem and _torch.call_draws_random_numbers(n)]
    from_generator = options.fallback_random or any(
        isinstance(v := n.meta.get("val"), torch.Tensor) and v.device.type == "cpu" for n in draws)
    return {"reorder_for_peak_memory": False, "reorder_for_locality": False} if len(draws) >= 2 and from_generator else {}


def _collective_order_config(graph: GraphModule) -> dict[str, Any]:
    """Inductor settings that keep where ``collectives.overlap`` put collectives and waits.

    Inductor's peak-memory reordering starts a collective as late and waits for it as early as
    it can (its buffer lives shorter), which undoes the overlap: on the 8-layer SimpleFSDP stack
    (2 gloo ranks) the forward's waits took 2-16 ms each with it and 0.1 ms without it. A graph
    with a functional collective is compiled in its own order.
    """
    if any(_torch.is_wait(n) for n in graph.graph.nodes):
        return {"reorder_for_peak_memory": False, "reorder_for_locality": False}
    return {}


def _region_config(graph: GraphModule) -> dict[str, Any]:
    """Inductor settings a graph that calls outlined regions (``invoke_subgraph``) needs.

    Inductor (torch 2.13) takes every region result for a buffer of its own (``MultiOutput``),
    so a result that shares an operand's memory (a body returning its input or a view of it)
    is not kept alive by buffer reuse: a later buffer could be written over it. ``joint`` has
    such results read from the operand itself; a graph that still reads one compiles with
    buffer reuse off. In-place buffers stay on.
    """
    return {"allow_buffer_reuse": False} if _torch.region_results_alias_operands(graph) else {}


def _compile_with_kernels_together(program: Program, options: InductorOptions, graphs: str,
                                   compile_graphs: Callable[[Program, InductorOptions], None]) -> None:
    """Compile the program's graphs with their kernels built together (and bundled), then count
    the kernels and their libraries in the report row. While it runs, the step's progress
    heartbeats say how many kernels Inductor has generated so far."""
    device_type = calls.device_type(program.example_inputs) or "cpu"
    watched: list[_torch.KernelBuilds] = []  # the heartbeat also covers the wait for the builds
    try:
        with progress.detail(lambda: f"{watched[0].generated_so_far()} kernels generated so far" if watched else ""), \
                _torch.kernels_compiled_together(bundle=options.bundle_kernels, device_type=device_type) as builds:
            watched.append(builds)
            compile_graphs(program, options)
    except PassError:
        raise
    except Exception as exc:  # noqa: BLE001 - a kernel that fails to build, found once the graphs are lowered
        raise PassError(inductor_fallback_message(graphs, program.training, exc, building_on=device_type)) from exc
    if builds.kernels:
        program.record_stat("cpp_kernels", builds.kernels)
        program.record_stat("kernel_libraries", builds.libraries)
    if builds.triton_kernels:
        program.record_stat("triton_kernels", builds.triton_kernels)


def _compile_forward_and_backward(program: Program, options: InductorOptions) -> None:
    graph_id, pair_state, pair = next(calls.graph_ids), _torch.InductorPairState(), cache_form.new_pair()
    fw_io, bw_io = program.io("forward"), program.io("backward")
    written = memory.mutations_to_write(program, "forward")
    if written:
        program.record_stat("mutations_written_in_graph", len(written))
    kept = [k for k in range(len(fw_io.outputs)) if k not in written]
    fw_compiled, fw_strides, fw_recipe, fw_source = _compile(
        program, "forward", _placeholder_values(program.graphs["forward"]), options,
        is_backward=False, is_inference=False,
        static=[k for k, d in enumerate(fw_io.inputs) if d.kind in ("param", "buffer")],
        visible=[j for j, k in enumerate(kept) if fw_io.outputs[k].kind == "user"],
        graph_id=graph_id, pair_state=pair_state, pair=pair, written=written,
    )
    strides_by_slot = dict(zip(kept, fw_strides)) if fw_strides else {}
    saved_stride = {d.index: strides_by_slot[k] for k, d in enumerate(fw_io.outputs) if d.kind == "saved" and k in strides_by_slot}
    bw_examples = _placeholder_values(program.graphs["backward"])
    for k, desc in enumerate(bw_io.inputs):
        stride = saved_stride.get(desc.index) if desc.kind == "saved" else None
        value = bw_examples[k]
        if stride is not None and isinstance(value, torch.Tensor) and tuple(value.stride()) != tuple(stride):
            bw_examples[k] = _torch.restride_fake(value, stride)
    # A backward lowered whole by Inductor donates nothing to the regions it calls
    # (``_torch.inductor_compile`` drops them); called from Python, each call gets those it reads last.
    donated = memory.donated_backward_inputs(program) if options.donate_saved else []
    bw_compiled, _, bw_recipe, bw_source = _compile(
        program, "backward", bw_examples, options,
        is_backward=True, is_inference=False,
        static=[k for k, d in enumerate(bw_io.inputs) if d.kind == "saved"],
        visible=list(range(len(bw_io.outputs))),
        graph_id=graph_id, pair_state=pair_state, pair=pair, donated=donated,
    )
    tangents = [k for k, d in enumerate(bw_io.inputs) if d.kind == "tangent" and isinstance(bw_examples[k], torch.Tensor)]
    program.compiled["forward"] = cache_form.cacheable(
        calls.with_source(calls.boxed(fw_compiled, sorted(written)), fw_source), fw_recipe, "boxed", written=sorted(written))
    program.compiled["backward"] = cache_form.cacheable(
        calls.with_source(calls.backward_call(bw_compiled, bw_examples, tangents, donated), bw_source), bw_recipe, "strides_of", tangents)


def _compile_main(program: Program, options: InductorOptions) -> None:
    io = program.io("main")
    written = memory.mutations_to_write(program, "main")
    if written:
        program.record_stat("mutations_written_in_graph", len(written))
    kept = [k for k in range(len(io.outputs)) if k not in written]
    compiled, _, recipe, source = _compile(
        program, "main", _placeholder_values(program.graphs["main"]), options,
        is_backward=False, is_inference=True,
        static=[k for k, d in enumerate(io.inputs) if d.kind in ("param", "buffer")],
        visible=[j for j, k in enumerate(kept) if io.outputs[k].kind == "user"],
        graph_id=next(calls.graph_ids), pair_state=_torch.InductorPairState(), written=written,
    )
    program.compiled["main"] = cache_form.cacheable(
        calls.with_source(calls.no_grad_boxed(compiled, sorted(written)), source), recipe, "no_grad", written=sorted(written))


def inductor_cache_context(options: InductorOptions) -> str:
    """What the compile cache key adds for this step: Inductor's config as this step sets it."""
    return _torch.inductor_config_digest(InductorOptions.model_validate(dict(options)).config_patches())


@graph_pass("codegen.inductor", produces={"compiled"}, options=InductorOptions, cache_context=inductor_cache_context,
            prepare=_torch.import_inductor_compiler)
def codegen_inductor(program: Program, **options: Any) -> bool:
    """Compile every graph with Inductor's inner compiler (fused C++/Triton kernels)."""
    opts = InductorOptions(**options)
    if "forward" in program.graphs:
        _compile_with_kernels_together(program, opts, "forward or backward", _compile_forward_and_backward)
    elif "main" in program.graphs:
        _compile_with_kernels_together(program, opts, "main", _compile_main)
    else:
        raise PassError(f"codegen.inductor: no 'forward'/'backward' or 'main' graph to compile (graphs: {', '.join(program.graphs)})")
    return False


@hookimpl
def passkit_register_passes() -> list:
    return [codegen_inductor]


@hookimpl
def passkit_register_decompositions() -> dict[str, Callable[[], dict[Any, Callable[..., Any]]]]:
    return {"inductor": _torch.inductor_decompositions}
