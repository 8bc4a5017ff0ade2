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
