"""Head-to-head timing: two contenders' steps back to back, one ratio per adjacent pair.

The benchmarks' tables divide one contender's median step by eager's, both taken over rounds in
which every contender runs once. On a shared host that ratio carries the host's drift: this
machine's speed wanders over hundreds of milliseconds (a one-thread 1024x1024 matmul timed 80
times in a row: lag-1 autocorrelation 0.86, quartiles at 0.90 and 1.07 of the median), and in a
round of twenty 200 ms steps two contenders run seconds apart. A step of one contender divided by
the step of the other run right next to it cancels most of that drift: on the d=256 block the
quartiles of such ratios sit within about 3% of their median where those of a table's per-step
ratios sit within about 10%. The targets that allow 3% for noise are judged on these ratios.

Each repetition runs ``A B B A`` and yields two ratios, ``B/A`` for each adjacent pair, so neither
contender always runs first (a first step can pay for the other's freed memory). Half of each
contender's steps follow a step of its own (caches warm with its weights, as in a training run)
and half follow the other's (as every step of a table's round does); on small models, whose
weights fit in cache, the two figures can differ by several percent, so both are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class PairedRatio:
    """``ours / theirs`` over adjacent pairs of steps: the median and its quartiles."""

    median: float
    q1: float
    q3: float
    pairs: int

    def __str__(self) -> str:
        return f"x{self.median:.3f} [{self.q1:.3f}-{self.q3:.3f}]"


def head_to_head(
    ours: Callable[[], object], theirs: Callable[[], object], repetitions: int, min_seconds: float = 0.0
) -> PairedRatio:
    """Time ``ours`` against ``theirs`` in ``A B B A`` blocks (two ratios each): ``repetitions``
    blocks, and more until ``min_seconds`` have passed (millisecond steps need hundreds)."""
    if repetitions < 1:
        raise ValueError(f"head_to_head needs at least one repetition, got {repetitions}")
    ratios: list[float] = []
    started = time.perf_counter()
    while len(ratios) < 2 * repetitions or time.perf_counter() - started < min_seconds:
        a1, b1, b2, a2 = (_seconds(step) for step in (theirs, ours, ours, theirs))
        ratios += [b1 / a1, b2 / a2]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return PairedRatio(median, q1, q3, len(ratios))


def repetitions(text: str) -> int:
    """``--pairs`` for argparse: a whole number, 0 or more (0 judges on the table's ratios)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started
