"""A child process for the compile cache tests: compile a small model, train one step, report.

Prints one JSON line: whether the compile was a cache hit, which passkit ran, how many passes ran, how often
Inductor's FX graph cache hit, missed or was bypassed, how many graphs Inductor hashed for its key, how often the
C++ compiler ran, and the outputs and gradients as lists
(the compiled model's and eager's), so the parent can compare processes exactly.
``CHILD_PIPELINE`` names the pipeline (default ``training-python``). With ``--hang-in-write``
it stops inside the cache write (after the temporary file is filled, before the rename), prints
``writing``, and waits to be killed. ``compile_and_report`` also runs in-process.

With ``--programs OUT PIPELINE...`` it instead runs every program of ``PROGRAMS`` that the
pipeline applies to (training programs through training pipelines, the same programs under
``no_grad`` through inference pipelines), each eagerly and compiled from the same seeds, and
saves with ``torch.save`` to ``OUT``, per pipeline and program: the compiled results (or the
error the compiled program raised), eager's, and each report's cache mark. Run twice against one cache folder, it shows whether a program
loaded from the cache computes what the compiled one did. With ``--dynamic`` it trains the
module whose batch size changes (``dynamic_and_report``) and prints one JSON line. With
``--regions`` it trains a block stack with dropout through ``CHILD_PIPELINE`` with the
``regions`` step added (``regions_and_report``): its layers outlined into one shared body.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time

import torch

import passkit
from passkit import _torch
from passkit.core.pass_api import Pass
from tiny_programs import regions_overlay


@contextlib.contextmanager
def graphs_hashed():
    """Inside, each graph Inductor hashes for its FX graph cache key adds one to the list."""
    from torch._inductor import codecache

    hash_graph, found = codecache.compiled_fx_graph_hash, []

    def counted(*args, **kwargs):
        found.append(1)
        return hash_graph(*args, **kwargs)

    codecache.compiled_fx_graph_hash = counted
    try:
        yield found
    finally:
        codecache.compiled_fx_graph_hash = hash_graph


@contextlib.contextmanager
def cpp_builds():
    """Inside, each run of the C++ compiler (a kernel, a bundle, a precompiled header or its
    preprocessor check) adds one to the list."""
    from torch._inductor.cpp_builder import CppBuilder

    build, found = CppBuilder.build, []

    def counted(self, *args, **kwargs):
        found.append(1)
        return build(self, *args, **kwargs)

    CppBuilder.build = counted
    try:
        yield found
    finally:
        CppBuilder.build = build


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
        with graphs_hashed() as hashed, cpp_builds() as built:
            out = compiled(x)
            out.sum().backward()
    finally:
        Pass.run = original
    return {
        "cache": compiled.passkit_reports[0].cache,
        "source": compiled.passkit_reports[0].source,
        "cpp_builds": len(built),
        "passkit": passkit.__file__,
        **_run_and_values(runs, hashed, model, out, eager, eager_out),
    }


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, p=0.5, training=True) * 2


def _mutate_input(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x * w


def _aliases(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.t(), x.view(-1)[2:7], x * 2


def _case_function(fn, make_inputs, mutated: tuple[int, ...] = ()):
    """Run ``fn`` on fresh inputs (eagerly or compiled): outputs, gradients, mutated inputs, and
    whether each output aliases the first input as eager's does."""

    def run(pipeline: str | None, training: bool):
        inputs = make_inputs(training)
        call = fn if pipeline is None else passkit.aot_function(fn, pipeline=pipeline)
        torch.manual_seed(3)
        with torch.set_grad_enabled(training):
            outs = call(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        aliased = [o._base is inputs[0] or o is inputs[0] for o in outs]
        if training:
            sum(o.sum() for o in outs).backward()
        values = [o.detach() for o in outs] + [inputs[k].detach() for k in mutated]
        grads = [x.grad for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        return {"values": values + grads, "aliased": aliased}, getattr(call, "passkit_reports", [])

    return run


def _case_batchnorm(pipeline: str | None, training: bool):
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(4)
    x = torch.randn(6, 4, requires_grad=training)
    call = bn if pipeline is None else passkit.aot_module(bn, pipeline=pipeline)
    with torch.set_grad_enabled(training):
        for _ in range(2):  # the second call reads the running statistics the first wrote
            out = call(x)
            if training:
                out.sum().backward()
    grads = [x.grad, bn.weight.grad, bn.bias.grad] if training else []
    values = [out.detach(), bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone()]
    return {"values": values + grads, "aliased": []}, getattr(call, "passkit_reports", [])


def _case_gpt2(pipeline: str | None, training: bool):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "models"))
    from zoo import _causal_lm, _gpt2

    torch.manual_seed(0)
    model = _gpt2()
    if not training:
        model.eval()
    torch.manual_seed(1)
    inputs = _causal_lm(2)
    call = model if pipeline is None else passkit.compile(model, pipeline=pipeline)
    torch.manual_seed(2)  # the same dropout masks
    with torch.set_grad_enabled(training):
        out = call(**inputs)
    if training:
        out.loss.backward()
    grads = [p.grad for p in model.parameters()] if training else []
    return {"values": [out.loss.detach(), out.logits.detach(), *grads], "aliased": []}, \
        getattr(call, "passkit_reports", [])


def _case_dynamic(pipeline: str | None, training: bool, norm: str = "batch"):
    """Batch sizes 2, 3, 4 through one compiled module (``dynamic=None``): the second size
    recompiles with a symbolic batch, which the third reuses; dropout and BatchNorm (or
    LayerNorm: BatchNorm's backward takes ``1 / batch`` as a symbolic float, and Inductor's FX
    graph cache bypasses such graphs) in it."""
    # Dynamo remembers which sizes changed per code object (Sequential.forward), across compiles:
    # forget it, so that each pipeline starts static and goes symbolic at the second size.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.3),
                                torch.nn.BatchNorm1d(8) if norm == "batch" else torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 3))
    if not training:
        model.eval()
    call = model if pipeline is None else passkit.compile(model, pipeline=pipeline)
    values = []
    for batch in (2, 3, 4):
        x = torch.randn(batch, 5, generator=torch.Generator().manual_seed(batch), requires_grad=training)
        torch.manual_seed(batch)  # the same dropout masks
        with torch.set_grad_enabled(training):
            out = call(x)
        if training:
            out.square().sum().backward()
            values.append(x.grad)
        values.append(out.detach())
    buffers = [b.clone() for b in model.buffers()]
    grads = [p.grad for p in model.parameters()] if training else []
    return {"values": values + buffers + grads, "aliased": []}, getattr(call, "passkit_reports", [])


PROGRAMS = {
    "dropout": _case_function(_dropout, lambda training: [torch.randn(6, 5, generator=torch.Generator().manual_seed(1),
                                                                      requires_grad=training)]),
    "batchnorm": _case_batchnorm,
    "input mutation": _case_function(
        _mutate_input,
        lambda training: [torch.randn(4, 3, generator=torch.Generator().manual_seed(1)),
                          torch.randn(4, 3, generator=torch.Generator().manual_seed(2), requires_grad=training)],
        mutated=(0,)),
    "aliased output": _case_function(_aliases, lambda training: [
        torch.randn(3, 4, generator=torch.Generator().manual_seed(1), requires_grad=training)]),
    "gpt2": _case_gpt2,
    "dynamic batch": _case_dynamic,
}


def run_programs(pipelines: list[str]) -> dict:
    """Every program through every pipeline that applies to it, compiled and eagerly."""
    results: dict = {}
    for pipeline in pipelines:
        training = "inference" not in pipeline
        for name, case in PROGRAMS.items():
            eager, _ = case(None, training)
            try:
                compiled, reports = case(pipeline, training)
            except Exception as exc:  # noqa: BLE001 - recorded, so the parent names every failing program
                lines = str(exc).strip().splitlines()
                compiled, reports = {"error": f"{type(exc).__name__}: {lines[0] if lines else ''}"}, []
            results[(pipeline, name)] = {"eager": eager, "compiled": compiled, "cache": [r.cache for r in reports]}
    return results


def dynamic_and_report() -> dict:
    """Train the dynamic-batch module (batches 2, 3, 4; LayerNorm) with ``CHILD_PIPELINE``: each report's
    cache mark and table, the passes that ran, Inductor's FX cache counts and the values."""
    runs: list[str] = []
    original = Pass.run
    Pass.run = lambda self, *args, **keywords: runs.append(self.name) or original(self, *args, **keywords)
    try:
        with graphs_hashed() as hashed:
            found, reports = _case_dynamic(os.environ.get("CHILD_PIPELINE", "training"), True, norm="layer")
    finally:
        Pass.run = original
    return {
        "cache": [r.cache for r in reports],
        "tables": [r.table() for r in reports],
        "passes_run": len(runs),
        "inductor": _torch.inductor_cache_counts(),
        "graphs_hashed": len(hashed),
        "values": [v.tolist() for v in found["values"]],
    }


class _DropoutBlock(torch.nn.Module):
    """The acceptance block with dropout after it (p=0.1, as GPT-2's)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        from passkit.examples import transformer

        self.block, self.drop = transformer.Block(dim, 4), torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.block(x))


class _DropoutStack(torch.nn.Module):
    def __init__(self, layers: int, dim: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_DropoutBlock(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def regions_and_report(layers: int = 4, dim: int = 32) -> dict:
    """Train a ``layers``-deep block stack with dropout one seeded step through ``CHILD_PIPELINE``
    with the ``regions`` step (an overlay written to the working directory), and eagerly: the
    cache mark, the regions the stored or fresh report names, the passes that ran, Inductor's
    FX cache counts, the graphs it hashed, and the values."""
    name = os.environ.get("CHILD_PIPELINE", "training")
    with open(f"{name}-regions.toml", "w") as handle:
        handle.write(regions_overlay(name))
    runs: list[str] = []
    original = Pass.run
    Pass.run = lambda self, *args, **keywords: runs.append(self.name) or original(self, *args, **keywords)
    try:
        torch.manual_seed(0)
        model = _DropoutStack(layers, dim)
        eager = copy.deepcopy(model)
        x = torch.randn(2, 16, dim, generator=torch.Generator().manual_seed(1))
        compiled = passkit.compile(model, pipeline=f"{name}-regions.toml")
        with graphs_hashed() as hashed:
            torch.manual_seed(2)  # the same dropout masks
            out = compiled(x)
            out.square().sum().backward()
    finally:
        Pass.run = original
    torch.manual_seed(2)
    eager_out = eager(x)
    eager_out.square().sum().backward()
    report = compiled.passkit_reports[0]
    return {
        "cache": report.cache,
        "repeats": next(r.stats.get("repeats") for r in report.records if r.id == "regions"),
        **_run_and_values(runs, hashed, model, out, eager, eager_out),
    }


def _run_and_values(runs: list, hashed: list, model: torch.nn.Module, out: torch.Tensor,
                    eager: torch.nn.Module, eager_out: torch.Tensor) -> dict:
    """What a compile ran and hashed, and its values next to eager's."""
    return {
        "passes_run": len(runs),
        "inductor": _torch.inductor_cache_counts(),
        "graphs_hashed": len(hashed),
        "out": out.detach().tolist(),
        "grads": [p.grad.tolist() for p in model.parameters()],
        "eager_out": eager_out.detach().tolist(),
        "eager_grads": [p.grad.tolist() for p in eager.parameters()],
    }


def main() -> None:
    if "--regions" in sys.argv:
        print(json.dumps(regions_and_report()), flush=True)
        return
    if "--dynamic" in sys.argv:
        print(json.dumps(dynamic_and_report()), flush=True)
        return
    if "--programs" in sys.argv:
        # Bit for bit needs one order of additions: without this, Inductor's embedding backward
        # adds from several threads (docs/exactness.md, "Run to run").
        torch.use_deterministic_algorithms(True)
        at = sys.argv.index("--programs")
        torch.save(run_programs(sys.argv[at + 2:]), sys.argv[at + 1])
        return
    if "--hang-in-write" in sys.argv:
        from passkit.cache import stores as cache
        def hang(fd: int) -> None:
            print("writing", flush=True)
            time.sleep(600)

        cache.os.fsync = hang  # the write stops between filling the temp file and the rename
    print(json.dumps(compile_and_report()), flush=True)


if __name__ == "__main__":
    main()
