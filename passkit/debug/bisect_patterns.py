"""Own the search inside one bad step: its first bad rewrite, and a narrower step that shows it.

A pass that makes many independent rewrites asks ``passkit_should_apply`` before each
(``rewrite`` does, once per pattern application), so ``passkit.debug.trial.StepFilter`` can
let the first ``n`` through and veto the rest. The asks come in a fixed order, and vetoing only
ever happens after the first ``n``, so the first ``n`` applications are the same in every trial.
A binary search over ``n`` then finds the smallest ``n`` that shows the failure: application
``n`` is the first bad one (CompilerBisector's "count of applications" and LLVM's
``-opt-bisect-limit``, one level down).

``narrowed`` offers narrower versions of the bad step for the minimal pipeline: for a
``rewrite`` step, only the bad application's pattern (``only``), then only its pattern set.
The caller keeps the first that still fails the same way.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from passkit.debug.trial import Outcome
    from passkit.core.hookspecs import Application
    from passkit.pipeline import Step
    from passkit.core.registry import Registry

__all__ = ["bisect_applications", "narrowed"]


def bisect_applications(full: Outcome, run_limited: Callable[[int], Outcome]) -> Application | None:
    """The first application of the bad step that shows the failure, or None.

    ``full`` is the bad step's trial with every application let through;
    ``run_limited(n)`` runs the same steps letting only the first ``n`` through. None when the
    step asked about no application, or when the failure shows with none of them (then it is
    not any single rewrite's fault).
    """
    total = len(full.applications)
    if not total or run_limited(0).bad:
        return None
    good, bad = 0, total
    while bad - good > 1:
        middle = (good + bad) // 2
        if run_limited(middle).bad:
            bad = middle
        else:
            good = middle
    return full.applications[bad - 1]


def narrowed(step: Step, application: Application, registry: Registry) -> Iterator[Step]:
    """Narrower versions of ``step`` that still make ``application``, narrowest first."""
    fields = type(step.options).model_fields
    if application.kind != "pattern" or "patterns" not in fields or "only" not in fields or not application.group:
        return
    values = dict(step.options)
    base = {**values, "patterns": [application.group], "expect_match": False}
    for options in ({**base, "only": [application.name]}, {**base, "only": None}):
        if options == values:
            return  # the step is already this narrow; what follows would widen it
        yield dataclasses.replace(step, options=step.pass_.options(registry=registry, **options))
