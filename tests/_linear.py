"""Linear-time checks a fast machine cannot fool: the work on an input of size n against 4n, in one run.

Each side is the least CPU time of a few runs (the least is the run the machine
disturbed least).  Linear work grows about 4 times, quadratic 16 times,
exponential past measuring: the bound, 12 times plus a small allowance for the
timer's grain, tells them apart without any bound on the time itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["assert_linear", "least_cpu_s"]

T = TypeVar("T")

REPEATS = 5
GROWTH = 4
RATIO = 12
GRAIN_S = 0.003


def least_cpu_s(work: Callable[[], object], repeats: int = REPEATS) -> float:
    """The least CPU time (this process) of *repeats* runs of *work*."""
    least = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        work()
        least = min(least, time.process_time() - start)
    return least


def assert_linear(make: Callable[[int], T], work: Callable[[T], object], n: int) -> None:
    """*work* on ``make(4 n)`` takes less than 12 times its time on ``make(n)`` (plus the timer's grain)."""
    small, large = make(n), make(GROWTH * n)
    small_s = least_cpu_s(lambda: work(small))
    large_s = least_cpu_s(lambda: work(large))
    assert large_s < RATIO * small_s + GRAIN_S, (
        f"n={n}: {small_s * 1000:.2f} ms, {GROWTH}n: {large_s * 1000:.2f} ms "
        f"({large_s / max(small_s, 1e-9):.1f} times): not linear"
    )
