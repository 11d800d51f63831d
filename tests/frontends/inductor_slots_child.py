"""A child process for the Inductor-slot cache tests: compile a small MLP with stock
``torch.compile`` and a mounted pipeline file, train one step, report Inductor's cache counters.

Usage: ``python inductor_slots_child.py FILE...``. Each file is mounted in turn (after
``torch._dynamo.reset()``), and one JSON line is printed: for each file, how often Inductor's
FX graph cache hit and missed during its compile, and the largest difference from eager.
``SLOTS_CHILD_PLUGIN`` names a module (importable from ``PYTHONPATH``) to register as a passkit
plugin first, as an installed plugin would be.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys

import torch
from torch._dynamo.utils import counters

import passkit


def compile_once(path: str) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    eager = copy.deepcopy(model)
    x = torch.randn(5, 6)
    before = dict(counters["inductor"])
    compiled = torch.compile(model, options=passkit.inductor_options(path))
    out = compiled(x)
    out.sum().backward()
    expected = eager(x)
    expected.sum().backward()
    found = counters["inductor"]
    difference = max(
        [float((out - expected).abs().max())]
        + [float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), eager.parameters())]
    )
    return {
        "file": os.path.basename(path),
        "hit": found["fxgraph_cache_hit"] - before.get("fxgraph_cache_hit", 0),
        "miss": found["fxgraph_cache_miss"] - before.get("fxgraph_cache_miss", 0),
        "difference": difference,
    }


def main() -> None:
    plugin = os.environ.get("SLOTS_CHILD_PLUGIN")
    if plugin:
        from passkit.core.plugins import get_plugin_manager

        get_plugin_manager().register(importlib.import_module(plugin), name=plugin)
    print(json.dumps([compile_once(path) for path in sys.argv[1:]]), flush=True)


if __name__ == "__main__":
    main()
