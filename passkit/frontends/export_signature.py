"""Own the way out of ``passkit.export``: an ``ExportedProgram`` rebuilt from a ``Program``'s
descriptors.

The graph signature is written anew from ``main``'s descriptors, never patched: each
placeholder's ``param``/``buffer``/``user`` descriptor names the input spec it came in with
(its kind, state-dict target, persistence), each ``mutation[i]`` output becomes a
``BUFFER_MUTATION`` (input i is a buffer) or ``USER_INPUT_MUTATION``, each ``user[j]`` output
the user output spec it came in with. So a pass never edits torch's signature by hand:

- a pass that drops an input (dead-code elimination of an unread placeholder, with its
  descriptor) drops its spec, and a parameter or buffer no input reads leaves the state dict;
- a pass that adds state registers it on ``main`` and reads it with ``get_attr``: a registered
  buffer or parameter becomes a ``BUFFER``/``PARAMETER`` input with its name as the target, any
  other tensor attribute (a constant made while tracing a decomposition) a lifted
  ``CONSTANT_TENSOR``, as ``torch.export`` lifts them.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.core.program import Program
from passkit.errors import PasskitError

__all__ = ["ExportState", "exported_from_program", "spec_kinds"]

_KIND_OF_SPEC = {
    InputKind.PARAMETER: "param",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "buffer",
    InputKind.USER_INPUT: "user",
}


def spec_kinds(specs: list[InputSpec]) -> list[str]:
    """passkit's input kind for each input spec; one line for a kind passkit cannot carry."""
    kinds = []
    for spec in specs:
        kind = _KIND_OF_SPEC.get(spec.kind)
        if kind is None:
            name = getattr(spec.arg, "name", "?")
            raise PasskitError(
                f"passkit.export: input {name!r} is a {spec.kind.name} "
                "(a script object or effect token), which passkit's pipelines cannot carry yet"
            )
        kinds.append(kind)
    return kinds


@dataclass(frozen=True)
class ExportState:
    """What the captured ``ExportedProgram`` holds besides its graph, kept for the rebuild."""

    inputs: tuple[InputSpec, ...]
    user_outputs: tuple[OutputSpec, ...]
    state_dict: dict[str, Any]
    constants: dict[str, Any]
    range_constraints: dict[Any, Any]
    module_call_graph: list[Any]
    example_inputs: Any

    @classmethod
    def of(cls, ep: torch.export.ExportedProgram) -> ExportState:
        signature = ep.graph_signature
        if any(spec.kind != OutputKind.USER_OUTPUT for spec in signature.output_specs):
            kinds = sorted({spec.kind.name for spec in signature.output_specs} - {"USER_OUTPUT"})
            raise PasskitError(f"passkit.export: the captured program already has {', '.join(kinds)} outputs; "
                               "export it with torch.export.export and pass that model, not a decomposed program")
        return cls(
            inputs=tuple(signature.input_specs),
            user_outputs=tuple(signature.output_specs),
            state_dict=dict(ep.state_dict),
            constants=dict(ep.constants),
            range_constraints=dict(ep.range_constraints),
            module_call_graph=copy.deepcopy(ep.module_call_graph),
            example_inputs=ep.example_inputs,
        )

    def real_inputs(self, specs: list[InputSpec]) -> list[Any]:
        """The real value of each input: a copy of its state-dict or constant tensor (running the
        captured program writes buffers in place), or the example input."""
        user = list(torch.utils._pytree.tree_leaves(self.example_inputs)) if self.example_inputs is not None else []
        values, next_user = [], 0
        for spec in specs:
            if spec.kind == InputKind.USER_INPUT:
                values.append(user[next_user] if next_user < len(user) else None)
                next_user += 1
            elif spec.kind == InputKind.CONSTANT_TENSOR or (spec.kind == InputKind.BUFFER and not spec.persistent):
                values.append(self.constants[spec.target])
            else:
                values.append(self.state_dict[spec.target])
        return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def exported_from_program(program: Program, state: ExportState, *, verifiers: Any = None) -> torch.export.ExportedProgram:
    """``program``'s ``main`` as an ``ExportedProgram`` with a signature rebuilt from its
    descriptors (see the module docstring), checked by ``verifiers`` (torch's by default;
    ExecuTorch's for an Edge-dialect program)."""
    gm = program.graphs["main"]
    io = program.io("main")
    state_dict, constants = dict(state.state_dict), dict(state.constants)
    placeholders = _placeholders(gm)
    spec_of = {desc.index: _input_spec(node, state.inputs[desc.index]) for node, desc in zip(placeholders, io.inputs)}
    input_specs = [spec_of[desc.index] for desc in io.inputs]
    first_user = next((k for k, spec in enumerate(input_specs) if spec.kind == InputKind.USER_INPUT), len(input_specs))
    before = placeholders[first_user] if first_user < len(placeholders) else None
    input_specs[first_user:first_user] = _lift_attributes(gm, before, state_dict, constants)
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    output_specs = [_output_spec(value, desc, state, spec_of) for value, desc in zip(output.args[0], io.outputs)]
    read = {spec.target for spec in input_specs if spec.target is not None}
    return torch.export.ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=ExportGraphSignature(input_specs=input_specs, output_specs=output_specs),
        state_dict={name: value for name, value in state_dict.items() if name in read},
        range_constraints=_torch.range_constraints_of(gm, state.range_constraints),
        module_call_graph=copy.deepcopy(state.module_call_graph),
        example_inputs=state.example_inputs,
        constants={name: value for name, value in constants.items() if name in read},
        verifiers=verifiers,
    )


def _placeholders(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _argument_like(argument: Any, node: Node) -> Any:
    """``argument`` (an input or output spec's) naming ``node`` instead."""
    if dataclasses.is_dataclass(argument) and hasattr(argument, "name") and not isinstance(argument, ConstantArgument):
        return dataclasses.replace(argument, name=node.name)
    return argument


def _input_spec(node: Node, original: InputSpec) -> InputSpec:
    return dataclasses.replace(original, arg=_argument_like(original.arg, node))


def _lift_attributes(
    gm: GraphModule, before: Node | None, state_dict: dict[str, Any], constants: dict[str, Any]
) -> list[InputSpec]:
    """Each tensor ``main`` reads with ``get_attr`` as a new placeholder (``before`` the first user
    input), its value in the state dict (a registered parameter or buffer) or the constants."""
    parameters, buffers = dict(gm.named_parameters()), dict(gm.named_buffers())
    reads = [n for n in gm.graph.nodes if n.op == "get_attr" and isinstance(_attribute(gm, str(n.target)), torch.Tensor)]
    if not reads:
        return []
    if before is None:
        before = next(n for n in gm.graph.nodes if n.op != "placeholder")
    specs = []
    by_target: dict[str, Node] = {}
    for node in reads:
        target = str(node.target)
        placeholder = by_target.get(target)
        if placeholder is None:
            with gm.graph.inserting_before(before):
                placeholder = gm.graph.placeholder(_fresh_name(gm, target))
            placeholder.meta.update(node.meta)
            value = _attribute(gm, target)
            if target in parameters or target in buffers:
                kind = InputKind.PARAMETER if target in parameters else InputKind.BUFFER
                state_dict[target] = value
            else:
                kind = InputKind.CONSTANT_TENSOR
                constants[target] = value
            specs.append(InputSpec(kind=kind, arg=TensorArgument(name=placeholder.name), target=target,
                                   persistent=True if kind == InputKind.BUFFER else None))
            by_target[target] = placeholder
        node.replace_all_uses_with(placeholder)
        gm.graph.erase_node(node)
    gm.recompile()
    return specs


def _attribute(gm: GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _fresh_name(gm: GraphModule, target: str) -> str:
    taken = {n.name for n in gm.graph.nodes}
    base = "c_" + target.replace(".", "_")
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _output_spec(value: Any, desc: Any, state: ExportState, spec_of: dict[int, InputSpec]) -> OutputSpec:
    argument = TensorArgument(name=value.name) if isinstance(value, Node) else ConstantArgument(name="", value=value)
    if desc.kind == "mutation":
        mutated = spec_of[desc.index]
        if mutated.kind == InputKind.BUFFER:
            return OutputSpec(kind=OutputKind.BUFFER_MUTATION, arg=argument, target=mutated.target)
        if mutated.kind == InputKind.USER_INPUT:
            return OutputSpec(kind=OutputKind.USER_INPUT_MUTATION, arg=argument, target=mutated.arg.name)
        raise PasskitError(f"passkit.export: the program writes into {mutated.kind.name.lower()} {mutated.target!r}, "
                           "which an exported program cannot do")
    original = state.user_outputs[desc.index]
    if isinstance(value, Node):
        return dataclasses.replace(original, arg=_argument_like(original.arg, value)
                                   if not isinstance(original.arg, ConstantArgument) else argument)
    return dataclasses.replace(original, arg=ConstantArgument(name=getattr(original.arg, "name", ""), value=value))
