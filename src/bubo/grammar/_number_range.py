"""GBNF for the decimal numbers of a range: JSON schema's bounds on ``type: number``, enforced while sampling.

A number is spelled ``-``? integer part, then ``.`` and 1 to *F* fraction digits
(:data:`FRACTION_DIGITS`, or fewer when ``multipleOf`` is ``10^-k``), no
exponent.  Scaled by ``10^F`` every such spelling is an integer, so a range is
a pair of scaled integers: the integer part of each end is spelled by
:mod:`._integer_range`, the fraction digit by digit, as the integer range does
(one nested group a digit).  Trailing zeros are allowed (``0.50``); a shorter
fraction compares as if padded with zeros.  No ``-0``: a negative spelling is
below zero.

The client reads the number as a double, so each bound is made sound for
doubles as well as for exact decimals: an inclusive bound is its own decimal
spelling (rounding to the nearest double keeps order, so nothing at or above
``0.5`` reads below ``0.5``); an exclusive bound starts past the midpoint between
the bound's double and the next one, so that nothing in range rounds back onto
the bound (``exclusiveMinimum: 0.5`` starts at ``0.5000000000000001``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from ._integer_range import OPEN_DIGITS, integer_range

__all__ = ["FRACTION_DIGITS", "number_bounds", "number_range"]

FRACTION_DIGITS = 16
"""Fraction digits of a bounded number: the converter's plain ``number`` allows 16."""

_DIGITS = "[0-9]"


def number_bounds(schema: Mapping[str, Any], fraction_digits: int = FRACTION_DIGITS) -> tuple[int, int]:
    """The least and greatest number *schema*'s bounds admit, as integers in units of ``10^-fraction_digits``.

    An empty range has the first above the second.  A side without a bound has
    :data:`~._integer_range.OPEN_DIGITS` integer digits, or as many as the other bound.
    """
    scale = 10**fraction_digits
    lows, highs = [], []
    if "minimum" in schema:
        lows.append(math.ceil(_exact(schema["minimum"]) * scale))
    if "exclusiveMinimum" in schema:
        lows.append(math.floor(_past(schema["exclusiveMinimum"], upwards=True) * scale) + 1)
    if "maximum" in schema:
        highs.append(math.floor(_exact(schema["maximum"]) * scale))
    if "exclusiveMaximum" in schema:
        highs.append(math.ceil(_past(schema["exclusiveMaximum"], upwards=False) * scale) - 1)
    low, high = (max(lows) if lows else None), (min(highs) if highs else None)
    digits = max(
        [OPEN_DIGITS] + [len(str(abs(bound) // scale)) for bound in (low, high) if bound is not None]
    )
    widest = 10**digits * scale - 1
    return (-widest if low is None else low, widest if high is None else high)


def _exact(bound: float) -> Fraction:
    """The bound as the decimal the client wrote (a float's shortest spelling, which reads back as it)."""
    return Fraction(bound) if isinstance(bound, int) else Fraction(repr(float(bound)))


def _past(bound: float, *, upwards: bool) -> Fraction:
    """The midpoint between the first double beyond *bound* and the double before it (exactly).

    Every decimal beyond this point reads as a double beyond the bound.
    """
    direction = math.inf if upwards else -math.inf
    beyond = float(bound)
    while (Fraction(beyond) <= Fraction(bound)) if upwards else (Fraction(beyond) >= Fraction(bound)):
        beyond = math.nextafter(beyond, direction)
    before = math.nextafter(beyond, -direction)
    return (Fraction(beyond) + Fraction(before)) / 2


def number_range(low: int, high: int, fraction_digits: int = FRACTION_DIGITS) -> str:
    """A GBNF expression (no rule references) for the decimals from *low* to *high* (units of ``10^-F``).

    With ``fraction_digits`` 0 these are integers, spelled without a fraction.

    Raises:
        ValueError: the range is empty.

    """
    if low > high:
        msg = f"no number is between {low} and {high} (units of 10^-{fraction_digits})"
        raise ValueError(msg)
    if fraction_digits == 0:
        return integer_range(low, high)
    parts = []
    if low < 0:  # below zero: "-" and a magnitude of at least one unit
        parts.append(f'"-" ({_magnitudes(max(1, -high), -low, fraction_digits)})')
    if high >= 0:
        parts.append(_magnitudes(max(0, low), high, fraction_digits))
    return " | ".join(f"({part})" for part in parts) if len(parts) > 1 else parts[0]


def _magnitudes(low: int, high: int, digits: int) -> str:
    """Spellings without a sign from *low* to *high* (0 ≤ low ≤ high, in units of ``10^-digits``).

    The integer parts the range covers with every fraction share one alternative; an end whose fraction
    is bounded has its own.
    """
    low_int, low_frac = divmod(low, 10**digits)
    high_int, high_frac = divmod(high, 10**digits)
    low_digits, high_digits = f"{low_frac:0{digits}d}", f"{high_frac:0{digits}d}"
    if low_int == high_int:
        return f'"{low_int}"{_fraction(_between(low_digits, high_digits))}'
    whole_low = low_int if low_frac == 0 else low_int + 1
    whole_high = high_int if high_frac == 10**digits - 1 else high_int - 1
    alternatives = []
    if whole_low > low_int:
        alternatives.append(f'"{low_int}"{_fraction(_between(low_digits, "9" * digits))}')
    if whole_low <= whole_high:
        alternatives.append(f"({integer_range(whole_low, whole_high)}){_fraction(_any(digits))}")
    if whole_high < high_int:
        alternatives.append(f'"{high_int}"{_fraction(_between("0" * digits, high_digits))}')
    return " | ".join(alternatives)


# A fraction language is (expression for its non-empty strings, whether the empty string is in it);
# a string stands for itself padded with zeros to the full number of digits.
_Language = tuple[str, bool]


def _fraction(language: _Language) -> str:
    """``.`` and the fraction, optional when no fraction at all is in range."""
    expression, empty = language
    return f' ("." {expression})?' if empty else f' "." {expression}'


def _any(count: int) -> _Language:
    return (_DIGITS if count == 1 else f"{_DIGITS}{{1,{count}}}"), True


def _rest(count: int) -> str:
    """Up to *count* more digits, after a space (nothing when *count* is 0)."""
    if count == 0:
        return ""
    return f" {_DIGITS}?" if count == 1 else f" {_DIGITS}{{0,{count}}}"


def _optional(language: _Language) -> str:
    """The language as a suffix after a space, empty string included."""
    expression, _ = language
    return f" ({expression})?"


def _between(low: str, high: str) -> _Language:
    """Digit strings of up to ``len(low)`` digits that, padded with zeros, are from *low* to *high*."""
    count = len(low)
    if low == "0" * count and high == "9" * count:
        return _any(count)
    if low == "0" * count:
        return _at_most(high)
    first, last = int(low[0]), int(high[0])
    if first == last:  # the empty string is below low (not all zeros), so a digit must come
        rest = _between(low[1:], high[1:]) if count > 1 else ("", True)
        tail = "" if count == 1 else (_optional(rest) if rest[1] else f" {rest[0]}")
        return f'"{first}"{tail}', False
    alternatives = [f'"{first}"{_at_least_tail(low[1:])}']
    if last - first > 1:
        alternatives.append(_digit_class(first + 1, last - 1) + _rest(count - 1))
    alternatives.append(f'"{last}"{_at_most_tail(high[1:])}')
    return f"({' | '.join(alternatives)})", False


def _at_most(high: str) -> _Language:
    """Digit strings of up to ``len(high)`` digits that, padded with zeros, are at most *high*."""
    count = len(high)
    if high == "9" * count:
        return _any(count)
    first = int(high[0])
    below = [_digit_class(0, first - 1) + _rest(count - 1)] if first > 0 else []
    return f'({"".join(b + " | " for b in below)}"{first}"{_at_most_tail(high[1:])})', True


def _at_most_tail(high: str) -> str:
    """What may follow a digit equal to the bound's: anything padding to at most *high*, or nothing."""
    return _optional(_at_most(high)) if high else ""


def _at_least_tail(low: str) -> str:
    """What may follow a digit equal to the bound's: anything padding to at least *low*."""
    if not low or low == "0" * len(low):
        return _rest(len(low))
    expression, _ = _between(low, "9" * len(low))
    return f" {expression}"


def _digit_class(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"
