"""Own one fuzz run: programs drawn from a seed, judged, the differences reduced and written.

``fuzz`` runs until ``programs`` programs are drawn or ``seconds`` have passed, calling
``progress`` with a line now and then, and returns a ``Summary``: how many programs were drawn
(``generated``), how many eager refused (``invalid``: not valid programs, not counted further),
how many the pipeline compiled and ran (``compiled``), how many were skipped because torch's own
path fails or differs on them too (``skipped``), and the differences, each reduced to a minimal
program (``passkit.fuzz.reduce``) with its first bad step and reproducer.

Differences of one kind whose first messages differ only in numbers (and the reproducer folder
the failing run wrote) are one finding: only the
first is reduced (and at most ``max_cases`` findings), the rest are counted with it.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from passkit.errors import PasskitError
from passkit.fuzz.compare import compile_with, judge, torch_path_for
from passkit.fuzz.generator import each_program, programs
from passkit.fuzz.program import FuzzProgram, Mode
from passkit.fuzz.reduce import Case, reduce_program, write_case

if TYPE_CHECKING:
    import pluggy

    from passkit.core.registry import Registry
    from passkit.pipeline import Pipeline

__all__ = ["Summary", "fuzz", "modes_for"]

_NUMBERS = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")
COUNT_WITHOUT_LIMIT = 10**7  # a --time run draws until its time is spent


@dataclass
class Summary:
    pipeline: str
    seed: int
    generated: int = 0
    invalid: int = 0
    compiled: int = 0
    skipped: int = 0
    differences: int = 0
    seconds: float = 0.0
    cases: list[Case] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def per_second(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        return (f"{self.generated} generated, {self.invalid} invalid (eager refuses them), {self.compiled} compiled, "
                f"{self.skipped} skipped (torch's path fails or differs too), {self.differences} difference(s) "
                f"in {self.seconds:.0f}s ({self.per_second:.2f} programs/s)")

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "seed": self.seed, "generated": self.generated, "invalid": self.invalid,
            "compiled": self.compiled, "skipped": self.skipped, "differences": self.differences,
            "seconds": round(self.seconds, 2), "programs_per_second": round(self.per_second, 3),
            "difference_kinds": dict(self.kinds), "skip_reasons": dict(self.skip_reasons.most_common(10)),
            "cases": [case.to_json() for case in self.cases],
        }


def modes_for(pipeline: Pipeline) -> tuple[Mode, ...]:
    """The modes a pipeline's programs run in: export; else training (and inference) when it can
    train; else inference."""
    if pipeline.kind == "export":
        return ("export",)
    return ("training", "inference") if pipeline.can_train else ("inference",)


def fuzz(
    pipeline: Pipeline, *, seed: int = 0, programs_count: int | None = 200, seconds: float | None = None,
    out: Path | None = None, reduce: bool = True, pm: pluggy.PluginManager, registry: Registry,
    plugins: Sequence[str] = (), progress: Callable[[str], None] | None = None, every: float = 10.0,
    max_cases: int = 10,
) -> Summary:
    """Fuzz ``pipeline``; differences are reduced and written under ``out`` (none written without it)."""
    from passkit.verify.compare import tolerance_for

    if pipeline.mounted or pipeline.kind == "edge":
        made = ("mounts its steps in Inductor's slots" if pipeline.mounted
                else 'is an edge pipeline (kind = "edge"): it makes an ExecuTorch program')
        raise PasskitError(f"{pipeline.label}: passkit fuzz compares programs it can call, and this file {made}; "
                           "fuzz a pipeline that compiles or exports, such as 'training' or 'export'")
    say = progress or (lambda text: None)
    summary = Summary(pipeline.label, seed)
    compiler = compile_with(pipeline)
    theirs = torch_path_for(pipeline)
    tolerance = tolerance_for(pipeline.settings, (s for s in pipeline.steps if s.enabled))
    started = last_said = time.monotonic()
    seen: set[tuple[str, str]] = set()

    def visit(program: FuzzProgram) -> bool:
        nonlocal last_said
        if seconds is not None and time.monotonic() - started >= seconds:
            return False
        summary.generated += 1
        verdict = judge(program, compiler, tolerance, theirs)
        if verdict.status == "invalid":
            summary.invalid += 1
        elif verdict.status == "skipped":
            summary.skipped += 1
            summary.skip_reasons[verdict.torch_message[:120]] += 1
        else:
            summary.compiled += verdict.kind != "crash"
        if verdict.bad:
            summary.differences += 1
            summary.kinds[verdict.kind] += 1
            key = (verdict.kind, _NUMBERS.sub("N", verdict.message.split(" (reproducer: ")[0]))
            say(f"program {summary.generated}: difference ({verdict.kind}): {verdict.message}")
            if key not in seen and reduce and len(summary.cases) < max_cases:
                seen.add(key)
                summary.cases.append(_reduced(program, verdict, len(summary.cases) + 1))
        now = time.monotonic()
        if now - last_said >= every:
            last_said = now
            summary.seconds = now - started
            say(f"fuzz: {summary.line()}")
        return True

    def _reduced(program: FuzzProgram, verdict: Any, number: int) -> Case:
        small = reduce_program(program, verdict, lambda candidate: judge(candidate, compiler, tolerance, theirs))
        say(f"  reduced from {len(program.nodes)} to {len(small.nodes)} op(s)")
        if out is None:
            return Case("", verdict, small, len(program.nodes))
        case = write_case(out / f"case-{number}", small, verdict, len(program.nodes), pipeline,
                          pm=pm, registry=registry, plugins=plugins)
        say(f"  {case.folder}: first bad step: {case.first_bad_step or case.note}")
        return case

    strategy = programs(modes_for(pipeline))
    count = programs_count if programs_count is not None else COUNT_WITHOUT_LIMIT
    each_program(strategy, visit, seed=seed, count=count)
    summary.seconds = time.monotonic() - started
    return summary
