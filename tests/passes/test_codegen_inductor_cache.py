"""``codegen.inductor``'s cache form of a graph that calls outlined regions: the bodies that
``invoke_subgraph`` calls are stored with the graph and reload to the code Inductor compiled, or
the graph is not stored at all."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from passkit import _torch
from passkit.passes import codegen_inductor_cache as cache_form

aten = torch.ops.aten


def _body(activation: Any) -> fx.GraphModule:
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    graph.output((graph.call_function(activation, (graph.call_function(aten.mm.default, (x, w)),)),))
    return fx.GraphModule(torch.nn.Module(), graph, class_name="Region")


def _two_region_calls(activation: Any = aten.relu.default) -> fx.GraphModule:
    """``relu(relu(x @ w) @ w)`` as two calls of one outlined body."""
    root = torch.nn.Module()
    root.passkit_region_0 = _body(activation)
    graph = fx.Graph()
    value, w = graph.placeholder("x"), graph.placeholder("w")
    body = graph.get_attr("passkit_region_0")
    for _ in range(2):
        call = graph.call_function(torch.ops.higher_order.invoke_subgraph, (body, "passkit_region_key", value, w))
        value = graph.call_function(operator.getitem, (call, 0))
    graph.output((value,))
    return fx.GraphModule(root, graph)


def _stored(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
    recipe = cache_form.snapshot(gm, inputs, is_backward=False, is_inference=True, static=[], visible=[0],
                                 config_patches={})

    def compiled(*args: Any) -> Any:
        return gm(*args)

    payload = getattr(cache_form.cacheable(compiled, recipe, "no_grad"), "passkit_cache_payload", None)
    return payload() if payload is not None else None


def test_a_graph_calling_a_region_body_is_stored_with_it_and_reloads_to_the_same_code_and_values() -> None:
    gm = _two_region_calls()
    inputs = [torch.randn(3, 3), torch.randn(3, 3)]
    loader, recipe = _stored(gm, inputs)
    assert loader == cache_form.LOADER
    reloaded = _torch.graph_from_data(recipe.graph)
    assert recipe.codes == _torch.graph_codes(gm) == _torch.graph_codes(reloaded)
    assert sorted(recipe.codes) == ["", "passkit_region_0"]
    assert "torch.ops.higher_order.invoke_subgraph(passkit_region_0, 'passkit_region_key', x, w)" in recipe.codes[""]
    assert type(reloaded.passkit_region_0).__name__ == "Region"
    torch.testing.assert_close(reloaded(*inputs), gm(*inputs), rtol=0, atol=0)
    torch.testing.assert_close(gm(*inputs)[0], ((inputs[0] @ inputs[1]).relu() @ inputs[1]).relu())


def test_a_region_body_that_calls_what_cannot_be_found_by_name_leaves_the_graph_uncached() -> None:
    def local_relu(x: torch.Tensor) -> torch.Tensor:  # a closure: not found again by module and name
        return x.relu()

    gm = _two_region_calls(local_relu)
    inputs = [torch.randn(3, 3), torch.randn(3, 3)]
    assert _torch.graph_data(gm) is None
    assert _stored(gm, inputs) is None


def test_one_body_read_under_two_names_reloads_as_one_module() -> None:
    gm = _two_region_calls()
    gm.passkit_region_1 = gm.passkit_region_0
    second = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.higher_order.invoke_subgraph][1]
    with gm.graph.inserting_before(second):
        second.args = (gm.graph.get_attr("passkit_region_1"), *second.args[1:])
    gm.recompile()
    data = _torch.graph_data(gm)
    reloaded = _torch.graph_from_data(data)
    assert reloaded.passkit_region_1 is reloaded.passkit_region_0
    assert _torch.graph_codes(reloaded) == _torch.graph_codes(gm)
