"""A tensor and its view, passed to one Dynamo graph as two inputs and written there, run as eager.

After a graph break Dynamo passes a tensor and a view of it as two inputs. The graph is compiled
over the memory they share (``frontends.synthetic_base``), so a write through one reaches the
other. Before, passkit refused such a call in one line where ``aot_eager`` ran it, and with
dynamic shapes a returned view of a written input came back as a copy: the second graph then got
two unrelated tensors and its write into the input never reached the returned view (a wrong value,
max |diff| 14.6 in ``passkit fuzz``). Each case is checked against eager and ``aot_eager``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import passkit

PIPELINES = ["training-python", "training"]


def _view_written_around_item(x0: torch.Tensor) -> tuple[torch.Tensor]:
    # Found by `passkit fuzz training-python --programs 600 --seed 0` (program 472).
    v1 = x0[0]
    v1.mul_(2.0)
    v3 = v1 * v1.sum().item()  # a graph break: v1 and x0 reach the next graph as two inputs
    x0.add_(1.0)
    return (v1,)


def _base_zeroed_beside_its_transpose(x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v1 = x0.t()
    y = v1 + torch.masked_select(v1, v1 > 0).sum()  # data-dependent: a graph break
    return y, x0.zero_()


def _view_written_beside_its_base(x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v1 = x0[:, 1:]
    n = int(v1.sum().item() > 0)  # a graph break
    v1.mul_(3.0)
    return x0 * 2 + n, v1


PROGRAMS: dict[str, Callable[..., Any]] = {
    "view_written_around_item": _view_written_around_item,
    "base_zeroed_beside_its_transpose": _base_zeroed_beside_its_transpose,
    "view_written_beside_its_base": _view_written_beside_its_base,
}


def _run(fn: Callable[..., Any], x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, list[bool]]:
    x0 = x.clone()
    with torch.no_grad():
        outs = fn(x0)
    shares = [o.untyped_storage().data_ptr() == x0.untyped_storage().data_ptr() for o in outs]
    return [o.clone() for o in outs], x0, shares


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_a_written_view_and_its_base_as_two_inputs_run_as_eager(program: str, pipeline: str, dynamic: bool) -> None:
    fn = PROGRAMS[program]
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    expected = _run(fn, x)
    torch._dynamo.reset()
    assert_same(_run(torch.compile(fn, backend="aot_eager", dynamic=dynamic), x), expected)
    torch._dynamo.reset()
    compiled = passkit.compile(fn, pipeline=pipeline, dynamic=dynamic, cache="off")
    assert_same(_run(compiled, x), expected)
    if dynamic:  # the same compiled graphs at another size
        other = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
        assert_same(_run(compiled, other), _run(fn, other))


def assert_same(actual: tuple[list[torch.Tensor], torch.Tensor, list[bool]],
                expected: tuple[list[torch.Tensor], torch.Tensor, list[bool]]) -> None:
    torch.testing.assert_close(actual[0], expected[0])
    torch.testing.assert_close(actual[1], expected[1])  # the input after the call
    assert actual[2] == expected[2]  # which outputs share the input's memory


def test_the_fuzzers_program_at_its_own_shape() -> None:
    # The shape the fuzzer drew: a leading 1, which Dynamo specializes, beside a symbolic 4.
    x = torch.randn(1, 4, generator=torch.Generator().manual_seed(0))
    expected = _run(_view_written_around_item, x)
    torch._dynamo.reset()
    compiled = passkit.compile(_view_written_around_item, pipeline="training-python", dynamic=True, cache="off")
    assert_same(_run(compiled, x), expected)


def test_views_that_need_grad_are_still_refused_in_one_line() -> None:
    # Their gradients would have to flow through each view's own history: not merged.
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.add_(1)
        return a + b

    torch._dynamo.reset()
    compiled = passkit.compile(fn, pipeline="training-python", cache="off")
    leaf = torch.ones(4, 2, requires_grad=True)
    base = leaf * 1
    with pytest.raises(passkit.PasskitError, match=r"^passkit: inputs \d and \d share memory"):
        compiled(base[0], base[0])


def test_views_two_rows_into_a_larger_tensor_run_as_eager() -> None:
    # The compiled graph re-makes each view where it lay at compile time; a call whose views lie
    # elsewhere in their memory must still write the caller's tensor as eager does.
    torch._dynamo.reset()
    compiled = torch.compile(_view_written_beside_its_base, backend=passkit.backend("training-python"))
    with torch.no_grad():
        compiled(torch.randn(3, 4))  # compiled with the views at the start of their memory
        larger = torch.randn(6, 4)
        expected_base = larger.clone()
        expected = _view_written_beside_its_base(expected_base[2:5])
        got = compiled(larger[2:5])  # the same sizes, two rows into a larger tensor
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(larger, expected_base)
    assert got[1].untyped_storage().data_ptr() == larger.untyped_storage().data_ptr()


def test_a_call_whose_views_lie_elsewhere_runs_dynamos_graph_after_one_warning() -> None:
    # Dynamo recompiles when the views' offsets change, so no call through torch.compile has
    # reached this guard; here the backend is handed Dynamo's graph, then called with the same
    # views eight elements further into their memory.
    from passkit.frontends.synthetic_base import merge_written_views

    graphs: list[tuple[Any, list[Any]]] = []

    def record(gm: Any, inputs: list[Any]) -> Any:
        graphs.append((gm, list(inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_view_written_beside_its_base, backend=record)(torch.randn(3, 4))
    [(gm, inputs)] = [(gm, inputs) for gm, inputs in graphs if merge_written_views(gm, inputs) is not None]
    call = passkit.backend("training-python", cache="off")(gm, inputs)

    def views_into(memory: torch.Tensor) -> list[torch.Tensor]:
        return [memory.as_strided(f.shape, f.stride(), f.storage_offset() + 8) for f in inputs]

    memory = torch.randn(40, generator=torch.Generator().manual_seed(0))
    expected_memory = memory.clone()
    with torch.no_grad():
        expected = gm.forward(*views_into(expected_memory))
        with pytest.warns(RuntimeWarning) as caught:
            got = call(*views_into(memory))
        again = call(*views_into(memory.clone()))  # one warning, not one per call
    assert [str(w.message) for w in caught] == [
        "passkit: input 0 shares memory with another input the graph writes, laid out otherwise than when it "
        "was compiled; such calls run Dynamo's graph eagerly"
    ]
    assert len(again) == len(got)
    torch.testing.assert_close(list(got), list(expected))
    torch.testing.assert_close(memory, expected_memory)  # the caller's memory written as eager writes it
