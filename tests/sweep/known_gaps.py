"""Reviewed known gaps of the OpInfo/ModuleInfo sweep: entry name -> why passkit does not match eager.

Each entry must still fail on its first sample (the sweep's xfail is strict), so fixing a gap
means deleting its line. None of these is a silent wrong value: each raises.
"""

from __future__ import annotations

DATA_DEPENDENT = "data-dependent output shape or value; passkit compiles static shapes only (one-line error, on_error='eager' runs it eagerly)"
SPARSE = "sparse inputs: the runtime wrapper reads strides and storages, which sparse tensors lack"

KNOWN_GAPS: dict[str, str] = {
    "combinations": DATA_DEPENDENT + " (masked_select)",
    "masked_select": DATA_DEPENDENT,
    "corrcoef": DATA_DEPENDENT + " (aten.equal on a tensor)",
    "cov": DATA_DEPENDENT + " (aten.equal on a tensor)",
    "linalg.lstsq": DATA_DEPENDENT,
    "linalg.lstsq.grad_oriented": DATA_DEPENDENT,
    "nn.functional.ctc_loss": DATA_DEPENDENT,
    "nn.CTCLoss": DATA_DEPENDENT,
    "nn.functional.gaussian_nll_loss": DATA_DEPENDENT + " (a tensor's value read as a Python number)",
    "nn.GaussianNLLLoss": DATA_DEPENDENT + " (a tensor's value read as a Python number)",
    "tensor_split": DATA_DEPENDENT + " (split points given as a tensor)",
    "sparse.mm.reduce": SPARSE,
    "sparse.sampled_addmm": SPARSE,
    "to_sparse": SPARSE,
}
