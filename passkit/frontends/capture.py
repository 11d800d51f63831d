"""Own capture: turning Dynamo's graph or a plain function into a ``Program``.

Capture fakes the example inputs, classifies each input (param, buffer, user), and runs the
graph once on fresh fake inputs to learn which outputs require grad and which alias an input,
so that the runtime wrapper can regenerate aliases exactly as eager returns them.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.errors import PasskitError
from passkit.core.program import Desc, GraphIO, InputInfo, OutputInfo, Program, Signature
from passkit.runtime.output_views import recorded_geometry
from passkit.runtime.subclasses import FlatGraph, flatten_subclasses, record_subclasses
from passkit.autodiff.hidden_writes import find_hidden_writes
from passkit.autodiff.traced_autograd import TapeObserver, calls_custom_function, made_by_function

__all__ = ["LOST_VALUE_ERROR", "program_from_graph", "program_from_flat_graph", "program_from_function"]

LOST_VALUE_ERROR = (
    "passkit: tracing the program lost track of a tensor it computes (it became a constant of "
    'its traced example); compile the function without that part, or use on_error = "eager"'
)


def _input_kind(name: str, value: Any) -> str:
    if isinstance(value, torch.nn.Parameter) or "_parameters_" in name:
        return "param"
    if "_buffers_" in name:
        return "buffer"
    return "user"


def _traced_values(gm: GraphModule) -> tuple[list[Any], list[Any]] | None:
    """The fake inputs and outputs Dynamo recorded while tracing, if every one is there."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    if not all("example_value" in n.meta for n in placeholders):
        return None
    if not all(isinstance(r, torch.fx.Node) and "example_value" in r.meta for r in results):
        return None
    return [n.meta["example_value"] for n in placeholders], [r.meta["example_value"] for r in results]


def _run_on_fresh_fakes(gm: GraphModule, real_inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    mode = _torch.fake_mode_of(real_inputs) or _torch.new_fake_mode(shape_env=_torch.needs_shape_env(gm))
    fresh = [_torch.fakify(mode, x) for x in real_inputs]
    with mode:
        outs = gm(*fresh)
    return fresh, list(outs) if isinstance(outs, (tuple, list)) else [outs]


def _analyse_outputs(gm: GraphModule, real_inputs: Sequence[Any]) -> tuple[list[OutputInfo], bool]:
    """Which outputs need grad, and which alias an input.

    Dynamo already traced the graph on fake tensors and left the values on the nodes; other
    graphs run once on fresh fake inputs (``_as_traced`` reads ``made_by_function`` off the tape).
    """
    traced = _traced_values(gm)
    fresh, outs = traced if traced is not None else _run_on_fresh_fakes(gm, real_inputs)
    sources = _torch.symbol_sources(fresh)
    storages = {
        _torch.StorageWeakRef(x.untyped_storage()): i
        for i, x in enumerate(fresh)
        if isinstance(x, torch.Tensor)
    }
    infos = []
    for out in outs:
        if not isinstance(out, torch.Tensor):
            infos.append(OutputInfo(is_tensor=False))
            continue
        info = OutputInfo(requires_grad=out.requires_grad)
        same = next((i for i, x in enumerate(fresh) if x is out), None)
        if same is not None:
            info.is_input, info.alias_of_input = True, same
        else:
            base = storages.get(_torch.StorageWeakRef(out.untyped_storage()))
            base_output = next((j for j, other in enumerate(outs) if out._base is not None and out._base is other), None)
            if base is not None:
                info.alias_of_input = base
            elif base_output is not None:
                info.alias_of_output = base_output
            if base is not None or base_output is not None:
                info.view, info.view_symbols = recorded_geometry(out, fresh[base] if base is not None else outs[base_output], sources)
                info.multi_output_view = _torch.is_multi_output_view(out)
                info.detached = base is not None and not out._is_view() and not out.requires_grad
        info.made_by_function = info.alias_of_input is not None and made_by_function(out, fresh)
        infos.append(info)
    needs_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in real_inputs)
    # An input that needs no grad but left the trace needing one was written, under autograd,
    # with a value that does (``x.copy_(w)``): its new value carries history, as in torch's AOT.
    gains_grad = any(getattr(x, "requires_grad", False) > getattr(r, "requires_grad", False) for x, r in zip(fresh, real_inputs))
    training = torch.is_grad_enabled() and needs_grad and (gains_grad or any(o.requires_grad for o in infos))
    return infos, training


def _inline_checkpoint_regions(gm: GraphModule) -> int:
    """Inline Dynamo's checkpoint regions, tagging their nodes ``recompute`` as tracing would.

    Dynamo wraps ``torch.utils.checkpoint`` bodies in a higher-order op that pre-dispatch
    functionalization cannot enter. Inlined, the body computes the same values; the
    ``recompute`` and ``ac_graph_id`` tags tell partitioners which values to recompute.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    regions = [n for n in gm.graph.nodes if n.op == "call_function" and _torch.is_activation_checkpoint(n.target)]
    for region_id, node in enumerate(regions, start=1):
        def tag(copied: Any, region_id: int = region_id) -> None:
            copied.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
            copied.meta["ac_graph_id"] = region_id

        _inline(gm, node, node.args[1:], tag)
    if regions:
        gm.graph.eliminate_dead_code(is_impure_node=_kept_by_dce)
        gm.recompile()
    return len(regions)


def _inline_symbolic_regions(gm: GraphModule) -> int:
    """Inline the ``invoke_subgraph`` calls of a graph with symbolic sizes.

    A layer marked with ``nested_compile_region`` (by the user, or by the ``regions`` step's
    ``trace_once``) reaches a recompile with symbolic sizes as a body that takes the sizes and
    the floats Dynamo left unspecialized as operands. passkit's stages split and call bodies of
    tensors only (the ``regions`` step outlines no layer with symbolic sizes either), so such a
    graph is compiled flat, as it would be unmarked.
    """
    placeholders = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if not _torch.has_symbolic_sizes(placeholders):
        return 0
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is hop]
    for node in calls:
        body = getattr(gm, node.args[0].target)
        expected = [n.meta.get("example_value") for n in body.graph.nodes if n.op == "placeholder"]
        _inline(gm, node, [_tensor_read_by_item(operand) if isinstance(value, torch.Tensor) else operand
                           for operand, value in zip(node.args[2:], expected)])
    if calls:
        gm.graph.eliminate_dead_code(is_impure_node=_kept_by_dce)
        gm.recompile()
    return len(calls)


def _inline_regions_that_write_operands(gm: GraphModule) -> int:
    """Inline the ``invoke_subgraph`` calls whose body writes into an operand or what may be a
    view of one (an in-place op, batch norm's running statistics): torch trains no such body
    ("does not currently support training with in-place input or buffer mutations"). A layer
    the ``regions`` step's ``trace_once`` marked is then traced inline, as the step leaves such
    a layer; one the user marked too, where torch would stop."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is hop
             and _writes_an_operand(getattr(gm, n.args[0].target))]
    for node in calls:
        _inline(gm, node, list(node.args[2:]))
    if calls:
        gm.graph.eliminate_dead_code(is_impure_node=_kept_by_dce)
        gm.recompile()
    return len(calls)


def _writes_an_operand(body: GraphModule) -> bool:
    operands = {n for n in body.graph.nodes if n.op == "placeholder"}
    reached = set(operands)  # the operands and anything made from one: it may be a view of it
    for node in body.graph.nodes:
        if node.op not in ("call_function", "call_method") or not node.args:
            continue
        if _torch.writes_in_place(node) and node.args[0] in reached:
            return True
        if "batch_norm" in str(node.target) and any(a in operands for a in node.args[1:3]):
            return True
        if node.args[0] in reached:
            reached.add(node)
    return False


def _kept_by_dce(node: Any) -> bool:
    """What dead-code elimination keeps after inlining: FX keeps no unread in-place method call."""
    return _torch.is_impure(node) or _torch.writes_in_place(node)


def _tensor_read_by_item(operand: Any) -> Any:
    """The tensor behind ``operand`` when it is that tensor's ``.item()``: Dynamo passes a stamped
    call the float it read out of a 0-dim tensor where the body reads the tensor itself."""
    if isinstance(operand, torch.fx.Node) and operand.op == "call_method" and operand.target == "item":
        return operand.args[0]
    return operand


def _inline(gm: GraphModule, node: Any, operands: Sequence[Any], on_copy: Callable[[Any], None] | None = None) -> None:
    """Put the body ``node`` calls in its place, reading ``operands``; its results' readers read
    the copied values."""
    body = getattr(gm, node.args[0].target)
    env = dict(zip((n for n in body.graph.nodes if n.op == "placeholder"), operands))
    results: Any = None
    with gm.graph.inserting_before(node):
        for inner in body.graph.nodes:
            if inner.op == "placeholder":
                continue
            if inner.op == "output":
                results = torch.fx.node.map_arg(inner.args[0], lambda n: env[n])
                continue
            env[inner] = gm.graph.node_copy(inner, lambda n: env[n])
            if on_copy is not None:
                on_copy(env[inner])
    for user in list(node.users):
        if user.target is operator.getitem:
            user.replace_all_uses_with(results[user.args[1]])
            gm.graph.erase_node(user)
    gm.graph.erase_node(node)


def _fake_inputs(gm: GraphModule, real_inputs: Sequence[Any], source: GraphModule) -> tuple[list[Any], Any]:
    """Fake twins of the inputs, in the fake mode they came from when there is one.

    Dynamo's graphs with symbolic sizes are traced on Dynamo's own fakes (their sizes are
    symbols of its shape environment), and inputs that are already fake (Dynamo's DDP
    optimizer hands each piece the previous piece's fake outputs) keep their mode: one program
    never mixes fake modes.
    """
    traced = _traced_values(gm)
    if traced is not None and _torch.has_symbolic_sizes(traced[0]):
        fakes = list(traced[0])
        return fakes, _torch.fake_mode_of(fakes)
    # The graph over subclasses (``source``) may build a NestedTensor where the flat one does not.
    shape_env = _torch.needs_shape_env(gm) or _torch.needs_shape_env(source)
    fake_mode = _torch.fake_mode_of(real_inputs) or _torch.new_fake_mode(shape_env=shape_env)
    return [_torch.fakify(fake_mode, x) for x in real_inputs], fake_mode


def program_from_graph(
    gm: GraphModule, real_inputs: Sequence[Any], *, kinds: Sequence[str | None] | None = None,
    source: GraphModule | None = None,
) -> Program:
    """Build a ``Program`` whose ``main`` is ``gm`` (Dynamo's graph or a captured trace).

    ``kinds`` names each input's kind; a ``None`` there (or no ``kinds``) is read off the input.
    ``source`` is the graph over subclass values that ``gm`` was flattened from, if any.
    """
    _inline_checkpoint_regions(gm)
    _inline_symbolic_regions(gm)
    _inline_regions_that_write_operands(gm)
    _torch.specialize_float_inputs(gm)
    fakes, fake_mode = _fake_inputs(gm, real_inputs, gm if source is None else source)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(real_inputs):
        raise ValueError(f"graph has {len(placeholders)} inputs but {len(real_inputs)} example inputs were given")
    inputs = []
    for i, (node, value, fake) in enumerate(zip(placeholders, real_inputs, fakes)):
        node.meta["val"] = fake
        kind = kinds[i] if kinds is not None and kinds[i] is not None else _input_kind(node.name, value)
        is_tensor = isinstance(value, torch.Tensor)
        inputs.append(
            InputInfo(
                name=node.name,
                kind=kind,  # type: ignore[arg-type]
                is_tensor=is_tensor,
                requires_grad=bool(is_tensor and value.requires_grad),
                is_leaf=bool(not is_tensor or value.is_leaf),
            )
        )
    outputs, training = _analyse_outputs(gm, real_inputs)
    # Differentiated at the level the user wrote, as AOT Autograd does: the graph kept as captured
    # (a flattened graph's joint already differentiates the graph over subclasses, ``source``).
    requires_grad = [info.requires_grad for info in inputs]
    lost = _what_forward_traces_lose(gm, fakes, requires_grad, fake_mode) if training and source is None else None
    io = GraphIO(inputs=[Desc(info.kind, i) for i, info in enumerate(inputs)],
                 outputs=[Desc("user", j) for j in range(len(outputs))])
    signature = Signature(inputs=inputs, outputs=outputs, graph_io={"main": io})
    program = Program(graphs={"main": gm}, signature=signature, example_inputs=fakes, fake_mode=fake_mode,
                      facts={"captured"}, training=training)
    if lost is not None:
        _differentiate_as_captured(program, _copy_of(gm), real_inputs, lost)
    return program


def _differentiate_as_captured(program: Program, source: Any, real_inputs: Sequence[Any], reason: str) -> None:
    """Have ``joint`` differentiate ``source`` (the captured graph, or the user's function) with
    autograd, flattening as it traces, as it does for a program over subclasses."""
    inputs, outputs = program.signature.inputs, program.signature.outputs
    plain = FlatGraph(program.graphs["main"], list(real_inputs), [None] * len(inputs), [None] * len(outputs),
                      [info.name for info in inputs], _torch.has_symbolic_sizes(program.example_inputs))
    kept = record_subclasses(program, plain, source)
    kept.captured_main, kept.reason = program.graphs["main"], reason


def _what_forward_traces_lose(gm: GraphModule, fakes: list[Any], requires_grad: list[bool], fake_mode: Any) -> str | None:
    """What differentiating the functional forward would lose of eager's gradient, if anything: the
    graph calls a user's ``autograd.Function`` (its backward is its own), builds a jagged
    NestedTensor (whose ops reach forward-only traces below its autograd rules: ``values()`` is a
    ``detach``), or writes in place where autograd does not see and then uses the tensor."""
    if calls_custom_function(gm):
        return "a custom autograd.Function"
    if _torch.builds_nested(gm):
        return "a jagged tensor built inside"
    if find_hidden_writes(gm, fakes, requires_grad, fake_mode).unfollowable is not None:
        return "an in-place write autograd does not record"
    return None


def _copy_of(gm: GraphModule) -> GraphModule:
    """The captured graph as it is now; passes rewrite ``main`` in place (``regions`` outlines it)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return GraphModule(gm, graph)


def program_from_function(
    fn: Callable[..., Any], real_inputs: Sequence[Any], *, kinds: Sequence[str] | None = None
) -> Program:
    """Trace ``fn(*real_inputs)`` with ``make_fx`` (pre-dispatch, so ``no_grad`` blocks stay).

    ``fn`` takes flat positional inputs and returns a tensor or a flat tuple of them.
    """
    def fakes() -> list[Any]:
        mode = _torch.new_fake_mode(shape_env=shape_env)
        return [_torch.fakify(mode, x) for x in real_inputs]

    shape_env = False

    tape = TapeObserver()

    def flat_fn(*args: Any) -> tuple[Any, ...]:
        out = fn(*args)
        flat = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        tape.observe(flat, args)
        return flat

    # Pre-dispatch graphs keep no_grad blocks but cannot hold functorch transforms (vmap, grad,
    # jacrev); such programs are captured post-dispatch, where the transforms are inlined.
    # Nor can they follow ``torch.autograd.grad`` called inside the function (a saved value
    # comes back as a frozen fake constant); post-dispatch traces follow it.
    def pre_dispatch_program() -> Program | None:
        gm = _torch.trace_graph(flat_fn, fakes(), pre_dispatch=True)
        if _torch.uses_functorch(gm) or _torch.holds_fake_constants(gm):
            return None
        flat = flatten_subclasses(gm, real_inputs, kinds)
        if flat is not None:  # the tape saw the subclass values: the stage decides the flags
            return program_from_flat_graph(flat, gm, joint_source=flat_fn if tape.custom_function else gm)
        return _as_traced(program_from_graph(gm, real_inputs, kinds=kinds), tape, flat_fn, real_inputs)

    try:
        try:
            program = pre_dispatch_program()
        except Exception as exc:
            if not _torch.asks_for_shape_env(exc):
                raise
            # A while_loop or a data-dependent op (nonzero, .item()): its fake rule needs a
            # ShapeEnv. Pre-dispatch, above autograd, the graph keeps a loop whole for ``joint``
            # (below, autograd rewrites it).
            shape_env = True
            program = pre_dispatch_program()
        if program is not None:
            return program
    except PasskitError:
        raise
    except Exception:  # noqa: BLE001 - the post-dispatch trace below raises the real error
        pass
    try:
        gm = _torch.trace_graph(flat_fn, fakes(), pre_dispatch=False)
    except Exception as exc:
        if not _torch.asks_for_shape_env(exc):
            raise
        shape_env = True  # a while_loop or a data-dependent op: its fake rule needs one
        gm = _torch.trace_graph(flat_fn, fakes(), pre_dispatch=False)
    if _torch.holds_fake_constants(gm):
        raise PasskitError(LOST_VALUE_ERROR)
    return _as_traced(program_from_graph(gm, real_inputs, kinds=kinds), tape, flat_fn, real_inputs)


def program_from_flat_graph(flat: FlatGraph, gm: GraphModule, *, joint_source: Any = None) -> Program:
    """The program of a graph ``flatten_subclasses`` took apart; ``gm`` is the graph over subclasses,
    which ``joint`` differentiates unless ``joint_source`` (the user's function) is given."""
    program = program_from_graph(flat.graph, flat.inputs, kinds=flat.kinds, source=gm)
    record_subclasses(program, flat, gm if joint_source is None else joint_source)
    return program


def _as_traced(program: Program, tape: TapeObserver, fn: Callable[..., Any], real_inputs: Sequence[Any]) -> Program:
    """Outputs need grad as the traced function made them: ``requires_grad_()`` adds the flag
    where the graph computes it from no input that needs grad, and ``torch.autograd.grad``
    inside the function clears it where the graph computes the gradient from such inputs.
    A custom ``autograd.Function`` it ran has ``joint`` differentiate the function itself."""
    if tape.requires_grad is not None and tape.made_by_function is not None:
        for info, requires_grad, by_function in zip(program.signature.outputs, tape.requires_grad, tape.made_by_function):
            info.requires_grad = requires_grad
            info.made_by_function = by_function and info.alias_of_input is not None
    if program.training and tape.custom_function is not None:
        _differentiate_as_captured(program, fn, real_inputs, "a custom autograd.Function")
    return program
