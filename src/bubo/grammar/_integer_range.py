"""GBNF for the integers of a range: JSON schema's integer bounds, enforced while sampling.

llama-cpp-python's Python schema converter ignores ``minimum``/``maximum`` on
integers (llama.cpp's C++ one does not).  The idea here is the C++ one's: write
the canonical decimal spellings of a range digit by digit.  A range of
naturals is split by length; for one length, the first digit where the two
ends differ splits it into the numbers sharing the low end's digit (whose
rest only has a lower bound), those strictly between (any rest) and those
sharing the high end's digit (whose rest only has an upper bound).  Each side
then needs one alternative per digit, so a range of *d* digits is O(d²)
characters.  Negative numbers are ``-`` and a range of naturals.  The spelling
is canonical: no leading zeros, no ``-0``.

An open side is bounded as the converter's plain ``integer`` is, at
:data:`OPEN_DIGITS` digits (or more when the other bound has more).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["BOUND_KEYWORDS", "OPEN_DIGITS", "integer_bounds", "integer_range"]

BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
OPEN_DIGITS = 16
"""Digits of an integer without a bound on that side: the converter's ``integer`` rule allows 16."""


def integer_bounds(schema: Mapping[str, Any]) -> tuple[int, int]:
    """The least and greatest integer *schema*'s bounds admit (an empty range has the first above the second).

    A bound may be any finite number; an exclusive one moves one integer inwards.
    """
    lows = [math.ceil(schema["minimum"])] if "minimum" in schema else []
    if "exclusiveMinimum" in schema:
        lows.append(math.floor(schema["exclusiveMinimum"]) + 1)
    highs = [math.floor(schema["maximum"])] if "maximum" in schema else []
    if "exclusiveMaximum" in schema:
        highs.append(math.ceil(schema["exclusiveMaximum"]) - 1)
    low, high = (max(lows) if lows else None), (min(highs) if highs else None)
    digits = max([OPEN_DIGITS] + [len(str(abs(bound))) for bound in (low, high) if bound is not None])
    widest = 10**digits - 1
    return (-widest if low is None else low, widest if high is None else high)


def integer_range(low: int, high: int) -> str:
    """A GBNF expression (no rule references) matching exactly the integers from *low* to *high*.

    Raises:
        ValueError: the range is empty.

    """
    if low > high:
        msg = f"no integer is between {low} and {high}"
        raise ValueError(msg)
    parts = []
    if low < 0:  # -1 … -n are "-" then 1 … n
        parts.append(f'"-" ({_naturals(max(1, -high), -low)})')
    if high >= 0:
        parts.append(_naturals(max(0, low), high))
    return " | ".join(f"({part})" for part in parts) if len(parts) > 1 else parts[0]


def _naturals(low: int, high: int) -> str:
    """The canonical spellings of *low* … *high* (0 ≤ low ≤ high): one alternative per length.

    The lengths a range covers whole (all but maybe its shortest and longest) share one alternative,
    the extra digits as nested optional groups, so that the sampler follows one path, not one per length.
    """
    alternatives, whole = [], []
    for length in range(len(str(low)), len(str(high)) + 1):
        shortest = 0 if length == 1 else 10 ** (length - 1)
        first, last = max(low, shortest), min(high, 10**length - 1)
        if length > 1 and (first, last) == (shortest, 10**length - 1):
            whole.append(length)
        else:
            alternatives.append(_same_length(str(first), str(last)))
    if whole:
        optional = "".join(" ([0-9]" for _ in whole[1:]) + ")?" * (len(whole) - 1)
        alternatives.append("[1-9]" + _any_digits(whole[0] - 1) + optional)
    return " | ".join(alternatives)


def _same_length(low: str, high: str) -> str:
    """Strings of digits of their length from *low* to *high*, as a GBNF alternation."""
    if not low:
        return '""'
    common = 0
    while common < len(low) and low[common] == high[common]:
        common += 1
    prefix = f'"{low[:common]}" ' if common else ""
    if common == len(low):
        return prefix.strip()
    low_digit, high_digit = int(low[common]), int(high[common])
    low_rest, high_rest = low[common + 1 :], high[common + 1 :]
    rest = len(low_rest)
    if low_rest == "0" * rest and high_rest == "9" * rest:  # every string from low to high
        return prefix + _digit_class(low_digit, high_digit) + _any_digits(rest)
    alternatives = [f'"{low_digit}"{_at_least(low_rest)}']
    if high_digit - low_digit > 1:
        alternatives.append(_digit_class(low_digit + 1, high_digit - 1) + _any_digits(rest))
    alternatives.append(f'"{high_digit}"{_at_most(high_rest)}')
    return f"{prefix}({' | '.join(alternatives)})"


def _at_least(low: str) -> str:
    """The strings of ``len(low)`` digits ≥ *low*, after a space (nothing for the empty string)."""
    if not low or low == "0" * len(low):
        return _any_digits(len(low))
    first = int(low[0])
    above = [_digit_class(first + 1, 9) + _any_digits(len(low) - 1)] if first < 9 else []
    return f' ("{first}"{_at_least(low[1:])}{"".join(" | " + a for a in above)})'


def _at_most(high: str) -> str:
    """The strings of ``len(high)`` digits ≤ *high*, after a space (nothing for the empty string)."""
    if not high or high == "9" * len(high):
        return _any_digits(len(high))
    first = int(high[0])
    below = [_digit_class(0, first - 1) + _any_digits(len(high) - 1)] if first > 0 else []
    return f' ({"".join(b + " | " for b in below)}"{first}"{_at_most(high[1:])})'


def _digit_class(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _any_digits(count: int) -> str:
    return " [0-9]" * count
