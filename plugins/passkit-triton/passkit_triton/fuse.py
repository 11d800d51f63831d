"""Own ``fuse.regions``: group pointwise ops and last-dim reductions into FX submodule regions.

A region has a *domain*: the shape ``D`` its kernel iterates over, rows (every dimension but the
last) by columns (the last). Every value in a region is one of three kinds:

- ``full``: shape ``D``, one value per element;
- ``row``: shape ``D[:-1] + [1]``, one value per row (a ``keepdim`` reduction and what follows);
- ``flat``: shape ``D[:-1]``, one value per row (a reduction without ``keepdim``).

Nodes are visited in graph order. A fusible node joins the region of one of its inputs when its
output has one of the region's kinds, its in-region inputs broadcast the way the kernel computes
them, the region stays under ``max_size``, and no path leaves the region and comes back to the
node (which would make the region depend on itself). Otherwise it joins a region over the same domain that already reads
one of its inputs (a sibling), or starts a region of its own.
Regions below ``min_size`` are dissolved. Each region then becomes one ``call_module`` node whose
submodule holds the region's ops; its ``meta["fusion_region"]`` says what the region is, and the
values it returns go through ``getitem`` nodes that keep the original nodes' metadata.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
import torch
from torch.fx import Graph, GraphModule, Node

import passkit
from passkit_triton.ops import FAMILIES, family_of

__all__ = ["FUSED", "FuseOptions", "Region", "check_fused", "fuse_regions", "shape_key"]

Kind = Literal["full", "row", "flat"]


class FuseOptions(pydantic.BaseModel):
    """Options of ``fuse.regions``, validated when the pipeline file loads."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    families: list[Literal["arithmetic", "transcendental", "comparison", "cast", "reduction"]] = pydantic.Field(
        default_factory=lambda: list(FAMILIES)
    )
    max_size: int = pydantic.Field(default=64, ge=1)
    min_size: int = pydantic.Field(default=2, ge=1)
    reduce_with_producers: bool = True


def shape_key(shape: Any) -> tuple[str, ...]:
    """A shape as comparable text: symbolic sizes compare by expression, never by guessing."""
    return tuple(str(dim) for dim in shape)


@dataclass
class Region:
    index: int
    domain: tuple[str, ...]
    nodes: list[Node] = field(default_factory=list)
    kinds: dict[Node, Kind] = field(default_factory=dict)
    has_reduction: bool = False

    @property
    def size(self) -> int:
        return sum(1 for node in self.nodes if node.target is not operator.getitem)

    def kind_of_shape(self, key: tuple[str, ...]) -> Kind | None:
        if key == self.domain:
            return "full"
        if not self.domain:
            return None
        if key == self.domain[:-1] + ("1",):
            return "row"
        if key == self.domain[:-1]:
            return "flat"
        return None


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


def _output_key(node: Node) -> tuple[str, ...]:
    value = _val(node)
    if node.target is torch.ops.aten.var_mean.correction:
        value = value[0]
    return shape_key(value.shape)


_ALLOWED_INPUT_KINDS: dict[Kind, set[Kind]] = {"full": {"full", "row"}, "row": {"row"}, "flat": {"flat"}}


class _Fuser:
    def __init__(self, gm: GraphModule, options: FuseOptions) -> None:
        self.gm = gm
        self.options = options
        self.regions: list[Region] = []
        self.region_of: dict[Node, Region] = {}
        self.reach: dict[Node, frozenset[int]] = {}

    def run(self) -> list[Region]:
        for node in self.gm.graph.nodes:
            self._visit(node)
            self.reach[node] = self._reach_of(node)
        return [r for r in self.regions if r.size >= self.options.min_size]

    def _reach_of(self, node: Node) -> frozenset[int]:
        found: set[int] = set()
        for arg in node.all_input_nodes:
            found |= self.reach.get(arg, frozenset())
            if arg in self.region_of:
                found.add(self.region_of[arg].index)
        return frozenset(found)

    def _visit(self, node: Node) -> None:
        if node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0]
            if source in self.region_of:  # the outputs of a var_mean in a region
                region = self.region_of[source]
                self._add(region, node, region.kinds[source])
            return
        family = family_of(node)
        if family is None or family not in self.options.families:
            return
        if family == "reduction":
            self._visit_reduction(node)
            return
        key = _output_key(node)
        for arg in node.all_input_nodes:
            region = self.region_of.get(arg)
            if region is None or region.size >= self.options.max_size:
                continue
            kind = region.kind_of_shape(key)
            if kind is None or not self._inputs_fit(region, node, kind) or not self._acyclic(region, node):
                continue
            self._add(region, node, kind)
            return
        sibling = self._sibling_region(node, key)
        if sibling is not None:
            self._add(sibling, node, "full")
            return
        self._start(node, key, "full")

    def _sibling_region(self, node: Node, key: tuple[str, ...]) -> Region | None:
        """A region that already reads one of ``node``'s inputs over the same domain.

        Joining it reads that input once instead of twice (``x * 0.5`` and ``erf(x * c)`` in GELU).
        """
        for arg in node.all_input_nodes:
            for user in arg.users:
                region = self.region_of.get(user)
                if (
                    region is not None
                    and region.domain == key
                    and region.size < self.options.max_size
                    and self._acyclic(region, node)
                ):
                    return region
        return None

    def _visit_reduction(self, node: Node) -> None:
        source = node.args[0]
        kind: Kind = "row" if (node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)) else "flat"
        region = self.region_of.get(source)
        if (
            self.options.reduce_with_producers
            and region is not None
            and region.kinds.get(source) == "full"
            and region.size < self.options.max_size
            and self._acyclic(region, node)
        ):
            self._add(region, node, kind)
            region.has_reduction = True
            return
        started = self._start(node, shape_key(_val(source).shape), kind)
        started.has_reduction = True

    def _inputs_fit(self, region: Region, node: Node, kind: Kind) -> bool:
        return all(
            region.kinds[arg] in _ALLOWED_INPUT_KINDS[kind] for arg in node.all_input_nodes if self.region_of.get(arg) is region
        )

    def _acyclic(self, region: Region, node: Node) -> bool:
        # Joining is safe unless an input outside the region depends on the region.
        return all(
            region.index not in self.reach.get(arg, frozenset())
            for arg in node.all_input_nodes
            if self.region_of.get(arg) is not region
        )

    def _start(self, node: Node, domain: tuple[str, ...], kind: Kind) -> Region:
        region = Region(index=len(self.regions), domain=domain)
        self.regions.append(region)
        self._add(region, node, kind)
        return region

    def _add(self, region: Region, node: Node, kind: Kind) -> None:
        region.nodes.append(node)
        region.kinds[node] = kind
        self.region_of[node] = region


def _outlined(gm: GraphModule, region: Region, name: str) -> None:
    """Replace the region's nodes in ``gm`` with one call to a new submodule ``name``."""
    members = set(region.nodes)
    externals: list[Node] = []
    for node in region.nodes:
        for arg in node.all_input_nodes:
            if arg not in members and arg not in externals:
                externals.append(arg)
    outputs = [
        node
        for node in region.nodes
        if not isinstance(_val(node), (tuple, list)) and any(user not in members for user in node.users)
    ]
    sub = Graph()
    env: dict[Node, Node] = {}
    for index, arg in enumerate(externals):
        env[arg] = sub.placeholder(f"in{index}")
        env[arg].meta = dict(arg.meta)
    for node in region.nodes:
        env[node] = sub.node_copy(node, lambda arg: env[arg])
        env[node].meta["fusion_kind"] = region.kinds[node]
    sub.output(tuple(env[node] for node in outputs))
    submodule = GraphModule(torch.nn.Module(), sub, class_name="FusionRegion")
    gm.add_submodule(name, submodule)

    last = region.nodes[-1]
    with gm.graph.inserting_after(last):
        call = gm.graph.call_module(name, tuple(externals))
    call.meta["fusion_region"] = {
        "kind": "reduction" if region.has_reduction else "pointwise",
        "size": region.size,
        "domain": list(region.domain),
        "ops": sorted({str(node.target) for node in region.nodes if node.target is not operator.getitem}),
    }
    call.meta["val"] = tuple(_val(node) for node in outputs)
    anchor = call
    for index, node in enumerate(outputs):
        with gm.graph.inserting_after(anchor):
            item = gm.graph.call_function(operator.getitem, (call, index))
        item.meta = dict(node.meta)
        node.replace_all_uses_with(item, delete_user_cb=lambda user: user not in members)
        anchor = item
    for node in reversed(region.nodes):
        gm.graph.erase_node(node)


def _topologically_sorted(gm: GraphModule) -> None:
    """Reorder nodes so every node follows its inputs, keeping the original order otherwise."""
    position = {node: index for index, node in enumerate(gm.graph.nodes)}
    placed: set[Node] = set()
    order: list[Node] = []

    def place(node: Node) -> None:
        stack = [node]
        while stack:
            top = stack[-1]
            pending = [arg for arg in top.all_input_nodes if arg not in placed]
            if pending:
                stack.append(min(pending, key=position.__getitem__))
                continue
            stack.pop()
            if top not in placed:
                placed.add(top)
                order.append(top)

    for node in gm.graph.nodes:
        place(node)
    if order == list(gm.graph.nodes):
        return
    graph = Graph(owning_module=gm)
    env: dict[Node, Node] = {}
    for node in order:
        env[node] = graph.node_copy(node, lambda arg: env[arg])
    gm.graph = graph


def fuse_graph(gm: GraphModule, options: FuseOptions, prefix: str) -> list[dict[str, Any]]:
    """Outline the fusion regions of one graph; returns each region's ``fusion_region`` record."""
    regions = _Fuser(gm, options).run()
    records = []
    for region in regions:
        name = f"{prefix}{region.index}"
        _outlined(gm, region, name)
    _topologically_sorted(gm)
    for node in gm.graph.nodes:
        if node.op == "call_module" and "fusion_region" in node.meta:
            records.append(node.meta["fusion_region"])
    gm.graph.lint()
    gm.recompile()
    return records


def check_fused(program: passkit.Program) -> str | None:
    """The ``fused`` fact's checker: every region is a submodule of fusible ops only."""
    for graph_name, gm in program.graphs.items():
        for node in gm.graph.nodes:
            if node.op != "call_module" or "fusion_region" not in node.meta:
                continue
            sub = gm.get_submodule(node.target)
            for inner in sub.graph.nodes:
                if inner.op == "call_function" and inner.target is not operator.getitem and family_of(inner) is None:
                    return f"{graph_name}:{node.name} holds {inner.target}, which may not fuse"
    return None


FUSED = passkit.Fact("fused", "pointwise ops and last-dim reductions are grouped in fusion-region submodules", check=check_fused)


@passkit.graph_pass("fuse.regions", requires={"functional"}, produces={"fused"}, options=FuseOptions)
def fuse_regions(
    program: passkit.Program, *, families: list[str], max_size: int, min_size: int, reduce_with_producers: bool
) -> bool:
    """Group pointwise ops and last-dim reductions into fusion regions (FX submodules).

    Runs on ``forward`` and ``backward`` after partitioning, or on ``main`` for inference; a
    ``joint`` graph is refused because the partitioner cannot see inside a region. The report's
    ``regions`` figure counts regions and ``fused_ops`` the ops inside them.
    """
    if "joint" in program.graphs:
        raise passkit.PassError("fuse.regions: runs after partition.* or on an inference program (found the 'joint' graph)")
    options = FuseOptions(
        families=families, max_size=max_size, min_size=min_size, reduce_with_producers=reduce_with_producers
    )
    records: list[dict[str, Any]] = []
    for name, gm in program.graphs.items():
        if any(node.op == "call_module" and "fusion_region" in node.meta for node in gm.graph.nodes):
            continue  # already fused: running the pass twice changes nothing
        records += fuse_graph(gm, options, prefix=f"fused_{name}_")
    program.record_stat("regions", len(records))
    program.record_stat("fused_ops", sum(record["size"] for record in records))
    return bool(records)
