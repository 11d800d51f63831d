"""``passkit.export`` of programs whose data decides a size or a value, beside torch's own
``torch.export.export(...).run_decompositions()`` of each.

- ExportDB's data-dependent cases (``torch._export.db.examples``, shipped in torch): the
  pipeline re-traces the graph, and each trace of ``.item()`` draws a fresh unbacked symbol
  (``u2`` where the capture had ``u0``). The exported program's range constraints name the
  symbols its graph holds, so ``torch.export.load`` rebuilds them; before, it failed with
  ``KeyError: u2``.
- OpInfo entries of composite ops whose C++ kernel reads its argument's elements (``istft``;
  ``tensor_split`` with a tensor of split points): the trace retries under torch's Python
  kernels, which read them through ``.item()``, as ``torch.export`` does; before,
  ``functionalize`` failed ("data is not allocated yet", ``aten.equal``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import torch
from torch._export.db.examples import all_examples
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils import _pytree as pytree

import passkit

pytestmark = pytest.mark.filterwarnings("ignore")

EXPORTDB_CASES = ["constrain_as_size_example", "constrain_as_value_example", "assume_constant_result"]


def _saved_and_loaded(exported: torch.export.ExportedProgram, path: Path) -> torch.export.ExportedProgram:
    torch.export.save(exported, path)
    return torch.export.load(path)


def _graph_unbacked_symbols(exported: torch.export.ExportedProgram) -> set[Any]:
    return {
        symbol
        for node in exported.graph.nodes
        if node.meta.get("val") is not None
        for symbol in free_unbacked_symbols(node.meta["val"])
    }


@pytest.mark.parametrize("name", EXPORTDB_CASES)
def test_an_exportdb_data_dependent_case_saves_loads_and_runs_as_eager(name: str, tmp_path: Path) -> None:
    case = all_examples()[name]
    args = case.example_args
    expected = case.model(*args)
    theirs = torch.export.export(case.model, args, dynamic_shapes=case.dynamic_shapes).run_decompositions()
    ours = passkit.export(case.model, args, dynamic_shapes=case.dynamic_shapes, cache="off")
    assert _graph_unbacked_symbols(ours) <= set(ours.range_constraints)
    for label, exported in (("torch", theirs), ("passkit", ours)):
        loaded = _saved_and_loaded(exported, tmp_path / f"{label}.pt2")
        torch.testing.assert_close(loaded.module()(*args), expected, msg=lambda m: f"{label}: {m}")


def test_a_data_dependent_program_from_the_compile_cache_saves_and_loads(tmp_path: Path) -> None:
    case = all_examples()["assume_constant_result"]
    args = case.example_args
    passkit.export(case.model, args)
    hit = passkit.export(case.model, args)
    assert hit.passkit_report.cache == "hit"
    loaded = _saved_and_loaded(hit, tmp_path / "hit.pt2")
    torch.testing.assert_close(loaded.module()(*args), case.model(*args))


# Entries whose C++ composite kernel reads tensor data, with the dtype OpInfo samples them in.
DATA_READING_OPS = {"istft": torch.complex64, "tensor_split": torch.float32}


class _OpModule(torch.nn.Module):
    """One OpInfo sample as a module of its tensor arguments, as torch's export OpInfo test wraps it."""

    def __init__(self, op: Callable[..., Any], flat: list[Any], spec: Any) -> None:
        super().__init__()
        self.op, self.flat, self.spec = op, flat, spec

    def forward(self, *tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        flat = [next(given) if isinstance(a, torch.Tensor) else a for a in self.flat]
        first, args, kwargs = pytree.tree_unflatten(flat, self.spec)
        return self.op(first, *args, **kwargs)


def _samples(name: str) -> list[tuple[_OpModule, tuple[torch.Tensor, ...]]]:
    op = next(op for op in op_db if op.name == name and not op.variant_test_name)
    modules = []
    for sample in op.sample_inputs("cpu", DATA_READING_OPS[name], requires_grad=False):
        flat, spec = pytree.tree_flatten((sample.input, list(sample.args), dict(sample.kwargs)))
        tensors = tuple(a for a in flat if isinstance(a, torch.Tensor))
        if name == "tensor_split" and not (tensors[1:] and tensors[1].dim() == 1):
            continue  # only split points given as a 1-D tensor (a 0-D count fails torch.export's capture too)
        modules.append((_OpModule(op.op, flat, spec), tensors))
    return modules


def _close(got: Sequence[Any], expected: Sequence[Any], label: str) -> None:
    torch.testing.assert_close(got, expected, msg=lambda m: f"{label}: {m}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DATA_READING_OPS))
def test_an_op_whose_kernel_reads_its_argument_exports_as_eager(name: str) -> None:
    samples = _samples(name)
    assert samples
    for module, tensors in samples:
        expected = module(*tensors)
        theirs = torch.export.export(module, tensors).run_decompositions()
        _close(theirs.module()(*tensors), expected, "torch")
        ours = passkit.export(module, tensors, cache="off")
        _close(ours.module()(*tensors), expected, "passkit")
