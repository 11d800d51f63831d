"""Reviewed known gaps of the OpInfo/ModuleInfo sweep: entry name -> the error it raises and why
passkit does not match eager.

Each entry must still raise that error on its first sample (the sweep's xfail is strict and
names the error type), so a gap that starts passing, or starts returning a wrong value (an
``AssertionError`` from the comparison), fails the test; fixing a gap means deleting its line.
None of these is a silent wrong value: each raises.
"""

from __future__ import annotations

from typing import NamedTuple

from passkit.errors import PasskitError


class Gap(NamedTuple):
    raises: type[BaseException]  # what the entry raises today; anything else fails the test
    reason: str


DATA_DEPENDENT = (
    "data-dependent output torch traces no symbolic result for, or a Python decision on tensor data; passkit "
    "carries unbacked sizes, not these (one-line error, on_error='eager' runs it eagerly)"
)
SPARSE = "sparse inputs: the runtime wrapper reads strides and storages, which sparse tensors lack"


def _data_dependent(detail: str = "") -> Gap:
    return Gap(PasskitError, DATA_DEPENDENT + detail)


# torch raises RuntimeError ("Sparse CSR tensors do not have strides") or its subclass
# NotImplementedError ("Cannot access storage of SparseTensorImpl").
_SPARSE = Gap(RuntimeError, SPARSE)

KNOWN_GAPS: dict[str, Gap] = {
    "corrcoef": _data_dependent(" (aten.equal on a tensor)"),
    "cov": _data_dependent(" (aten.equal on a tensor)"),
    "linalg.lstsq": _data_dependent(),
    "linalg.lstsq.grad_oriented": _data_dependent(),
    "nn.functional.ctc_loss": _data_dependent(),
    "nn.CTCLoss": _data_dependent(),
    "nn.functional.gaussian_nll_loss": _data_dependent(" (an if on a tensor's value)"),
    "nn.GaussianNLLLoss": _data_dependent(" (an if on a tensor's value)"),
    "sparse.mm.reduce": _SPARSE,
    "sparse.sampled_addmm": _SPARSE,
    "to_sparse": _SPARSE,
}
