"""The step loop defers Python's full garbage collections while the steps run."""

from __future__ import annotations

import gc

from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

from tiny_programs import Kit, make_program

KEPT: list[list[int]] = []


@graph_pass("t.churn")
def churn(program: Program) -> bool:
    """Allocate as a compile does: many container objects that outlive the young collections."""
    KEPT.extend([] for _ in range(len(gc.get_objects()) // 2 + 200_000))
    return False


class ChurnPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [churn]


def test_no_full_collection_runs_while_the_steps_run_and_the_thresholds_come_back() -> None:
    kit = Kit(ChurnPasses())
    generations: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    before = gc.get_threshold()
    gc.collect()
    gc.callbacks.append(watch)
    try:
        kit.run(kit.pipeline("t.churn"), make_program())
    finally:
        gc.callbacks.remove(watch)
        KEPT.clear()
    assert (2 in generations, 1 in generations, gc.get_threshold()) == (False, True, before)
