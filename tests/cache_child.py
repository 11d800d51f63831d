"""A child process for the compile cache tests: compile a small model, train one step, report.

Prints one JSON line: whether the compile was a cache hit, which passkit ran, how many passes ran, how often
Inductor's FX graph cache hit, missed or was bypassed, and the outputs and gradients as lists
(the compiled model's and eager's), so the parent can compare processes exactly.
``CHILD_PIPELINE`` names the pipeline (default ``training-python``). With ``--hang-in-write``
it stops inside the cache write (after the temporary file is filled, before the rename), prints
``writing``, and waits to be killed. ``compile_and_report`` also runs in-process.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

import torch

import passkit
from passkit import _torch
from passkit.pass_api import Pass


def compile_and_report() -> dict:
    """Compile and train the model once, counting the passes that ran (restores what it patches)."""
    runs: list[str] = []
    original = Pass.run

    def counting(self, program, options=None, **keywords):
        runs.append(self.name)
        return original(self, program, options, **keywords)

    Pass.run = counting
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
        x = torch.randn(5, 6)
        eager = copy.deepcopy(model)
        eager_out = eager(x)
        eager_out.sum().backward()
        compiled = passkit.compile(model, pipeline=os.environ.get("CHILD_PIPELINE", "training-python"))
        out = compiled(x)
        out.sum().backward()
    finally:
        Pass.run = original
    return {
        "cache": compiled.passkit_reports[0].cache,
        "passkit": passkit.__file__,
        "passes_run": len(runs),
        "inductor": _torch.inductor_cache_counts(),
        "out": out.detach().tolist(),
        "grads": [p.grad.tolist() for p in model.parameters()],
        "eager_out": eager_out.detach().tolist(),
        "eager_grads": [p.grad.tolist() for p in eager.parameters()],
    }


def main() -> None:
    if "--hang-in-write" in sys.argv:
        from passkit import cache

        def hang(fd: int) -> None:
            print("writing", flush=True)
            time.sleep(600)

        cache.os.fsync = hang  # the write stops between filling the temp file and the rename
    print(json.dumps(compile_and_report()), flush=True)


if __name__ == "__main__":
    main()
