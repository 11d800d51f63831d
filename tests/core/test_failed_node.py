"""A step that fails on a node names the node, its op and the user's source line in one line."""

from __future__ import annotations

import pytest
import torch

import passkit
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass


class _RefuseRelu(torch.fx.Interpreter):
    def call_function(self, target, args, kwargs):
        if target is torch.ops.aten.relu.default:
            raise ValueError("relu is not allowed here")
        return super().call_function(target, args, kwargs)


@graph_pass("test.interpret_refusing_relu", requires={"functional"})
def interpret_refusing_relu(program) -> bool:
    """Re-run main through an interpreter that refuses relu (a pass failing mid-graph)."""
    gm = program.graphs["main"]
    with program.fake_mode:
        _RefuseRelu(gm).run(*program.example_inputs)
    return False


@graph_pass("test.loop_refusing_sum", requires={"functional"})
def loop_refusing_sum(program) -> bool:
    """Walk the nodes and refuse sum (a pass failing in its own loop)."""
    for node in program.graphs["main"].graph.nodes:
        if node.target is torch.ops.aten.sum.default:
            raise NotImplementedError("cannot handle sums")
    return False


class _Plugin:
    @hookimpl
    def passkit_register_passes(self):
        return [interpret_refusing_relu, loop_refusing_sum]


def double_then_relu(x):
    y = x * 2
    return torch.relu(y).sum()


@pytest.mark.parametrize(
    "pass_name, node, message",
    [
        ("test.interpret_refusing_relu", "relu (aten.relu.default, test_failed_node.py:46)", "ValueError: relu is not allowed here"),
        ("test.loop_refusing_sum", "sum_1 (aten.sum.default, test_failed_node.py:46)", "NotImplementedError: cannot handle sums"),
    ],
)
def test_a_pass_failing_on_a_node_names_it_and_the_source_line(
    tmp_path, register_passkit_plugin, pass_name: str, node: str, message: str
) -> None:
    register_passkit_plugin(_Plugin(), name="test-failed-node")
    path = tmp_path / "p.toml"
    path.write_text(f'[pipeline]\nname = "p"\n\n[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "{pass_name}"\n\n[[steps]]\npass = "codegen.python"\n')
    torch._dynamo.reset()
    compiled = passkit.compile(double_then_relu, pipeline=str(path), repro_dir=str(tmp_path / "repro"))
    with pytest.raises(passkit.PassError) as caught:
        compiled(torch.randn(4))
    assert str(caught.value) == (
        f"{path}: steps[1] ({pass_name}) failed at node {node}: {message} (after: functionalize) "
        f"(reproducer: {tmp_path / 'repro'}/02-{pass_name})"
    )


def test_a_failure_without_a_node_names_only_the_step(tmp_path) -> None:
    from passkit.core.failed_node import where_it_failed

    assert where_it_failed(ValueError("no graph involved")) == ""
