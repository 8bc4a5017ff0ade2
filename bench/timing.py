"""Arithmetic over the times a client saw: percentiles, and the gaps between a stream's tokens.

Pure functions (no server, no clock) so that the benchmark's statistics are tested on their own
(bench/test_timing.py).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence


def p95(values: Sequence[float]) -> float:
    """The 95th percentile, interpolated between the values (the inclusive method); one value: itself.

    Raises:
        ValueError: *values* is empty.

    """
    if not values:
        raise ValueError("the 95th percentile of no values")
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0 to 100), interpolated between the sorted values; one value: itself.

    The same inclusive method as :func:`p95` (numpy's default ``linear``), at any *q*.

    Raises:
        ValueError: *values* is empty, or *q* is outside 0 to 100.

    """
    if not values:
        raise ValueError("a percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0 to 100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50, p95, p99 and mean of *values* (empty: an empty summary)."""
    if not values:
        return {}
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values),
    }


def gaps(times: Sequence[float]) -> list[float]:
    """The time between each arrival and the one before it."""
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def gaps_overlapping(times: Sequence[float], start: float, end: float) -> list[float]:
    """The gaps between consecutive arrivals that overlap the window from *start* to *end*.

    A gap overlaps when it begins before the window ends and ends after the window
    begins: the gap in which the window opens counts (the stream stalls from its last
    token on), and so does the one in which it closes.  A window inside one gap
    gives that gap alone; arrivals that all lie before or after the window give none.
    """
    return [
        later - earlier for earlier, later in itertools.pairwise(times) if earlier < end and later > start
    ]


def outlasted(times: Sequence[float], end: float) -> bool:
    """Whether a stream's tokens went on past *end* (else the gap in which the window closed is unknown)."""
    return bool(times) and times[-1] > end
