"""Which grammar a bounded or stepped ``integer``/``number`` schema gets, or why it cannot get one.

One decision, read twice: :func:`check_numeric` (by :func:`bubo.grammar.check_schema`, before a
request queues, to refuse with a 400) and :func:`numeric_expression` (by the schema converter).

- ``integer`` with bounds: :mod:`._integer_range`.
- ``number`` with bounds: :mod:`._number_range` (no exponent, 16 fraction digits).
- ``multipleOf`` 1, 0.1, 0.01, … (``10^-k``, k ≤ 16) on a ``number``: *k* fraction digits, with any bounds.
- ``multipleOf`` a whole number *c* (on either type; a ``number`` then has no fraction):
  :mod:`._multiples`, with bounds that only fix the sign or leave at most 500 multiples.

Anything else (``multipleOf: 0.5`` or ``0.25``, a fractional ``multipleOf`` on an integer, a
step with more than 16 fraction digits, a large divisor, a wide range of multiples) is refused.
The smallest *k* is found one digit at a time, after :func:`bubo.grammar.check_schema` bounded the
value's digits, so a hostile ``1e-300`` costs a few hundred steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import attrs

from ._integer_range import BOUND_KEYWORDS, integer_bounds
from ._multiples import MAX_DIVISOR, MAX_LISTED, Multiples, divisible, multiples_plan, stripped, trie
from ._number_range import FRACTION_DIGITS, number_bounds, number_range

__all__ = ["NUMERIC_KEYWORDS", "NumericRefused", "check_numeric", "numeric_expression", "step"]

NUMERIC_KEYWORDS = (*BOUND_KEYWORDS, "multipleOf")


@attrs.define
class NumericRefused(Exception):
    """No grammar can enforce *keyword* as the schema uses it; ``too_complex``: only a limit is in the way."""

    keyword: str
    reason: str
    too_complex: bool = False

    def __str__(self) -> str:
        return f"{self.keyword} {self.reason}"


def step(multiple: float) -> tuple[int, int]:
    """*multiple* as ``c x 10^-k`` with the least *k* (``0.05`` is ``(5, 2)``).

    A float is read as its shortest spelling, the decimal the client wrote.
    """
    exact = Fraction(multiple) if isinstance(multiple, int) else Fraction(repr(float(multiple)))
    k = 0
    while (exact * 10**k).denominator != 1:
        k += 1
    return int(exact * 10**k), k


@attrs.frozen
class _Range:
    low: int
    high: int
    fraction_digits: int  # 0: an integer


def _plan(schema: Mapping[str, Any], kind: str) -> _Range | Multiples:
    """The grammar's plan for a schema of type *kind* (``integer``/``number``) with bounds or ``multipleOf``.

    Raises:
        NumericRefused: no grammar within the limits enforces it.

    """
    bound = next((keyword for keyword in schema if keyword in BOUND_KEYWORDS), "multipleOf")
    multiple = schema.get("multipleOf")
    divisor, digits = (1, 0 if kind == "integer" else FRACTION_DIGITS) if multiple is None else step(multiple)
    if digits > 0 and kind == "integer":
        raise NumericRefused("multipleOf", f"is {multiple!r}; on an integer it must be a whole number")
    if digits > 0 and divisor != 1:
        raise NumericRefused("multipleOf", f"is {multiple!r}; on a number only a whole number or "
                             "1, 0.1, 0.01, … (10^-k) are enforced")  # fmt: skip
    if digits > FRACTION_DIGITS:
        raise NumericRefused(
            "multipleOf", f"is {multiple!r}; at most {FRACTION_DIGITS} fraction digits are supported",
            too_complex=True,
        )  # fmt: skip
    if digits > 0:
        low, high = number_bounds(schema, digits)
        if low > high:
            raise NumericRefused(bound, "admits no number, with the bounds beside it")
        return _Range(low, high, digits)
    low, high = integer_bounds(schema)
    if low > high:
        raise NumericRefused(bound, "admits no integer, with the bounds beside it")
    if divisor == 1:
        return _Range(low, high, 0)
    return _multiples(divisor, low, high, bound)


def _multiples(divisor: int, low: int, high: int, bound: str) -> Multiples:
    if stripped(divisor)[0] > MAX_DIVISOR:
        raise NumericRefused(
            "multipleOf", f"is {divisor}; without its trailing zeros a divisor may be at most "
            f"{MAX_DIVISOR} (the grammar has a rule per remainder and digit)", too_complex=True,
        )  # fmt: skip
    plan = multiples_plan(divisor, low, high, max(-low, high))
    if plan is None:
        raise NumericRefused(
            bound, f"beside multipleOf is enforced only when the bounds fix the sign (0 as a bound) or "
            f"leave at most {MAX_LISTED} multiples", too_complex=True,
        )  # fmt: skip
    if plan.listed == ():
        raise NumericRefused(bound, f"admits no multiple of {divisor}, with the bounds beside it")
    return plan


def check_numeric(schema: Mapping[str, Any], kind: str) -> int | None:
    """Refuse a schema of type *kind* whose bounds or ``multipleOf`` no grammar here can write.

    Returns:
        The divisor (without trailing zeros) whose remainder rules the grammar will hold, if any.

    Raises:
        NumericRefused: the keyword, and why.

    """
    plan = _plan(schema, kind)
    if isinstance(plan, Multiples) and plan.listed is None:
        return stripped(plan.divisor)[0]
    return None


def numeric_expression(schema: Mapping[str, Any], kind: str, add_rule: Callable[[str, str], str]) -> str:
    """A GBNF expression for the values of *schema* (type *kind*), its helper rules added by *add_rule*.

    Raises:
        NumericRefused: as :func:`check_numeric`.

    """
    plan = _plan(schema, kind)
    if isinstance(plan, _Range):
        return number_range(plan.low, plan.high, plan.fraction_digits)
    if plan.listed is not None:
        return trie([str(value) for value in plan.listed])
    positive = divisible(plan.divisor, add_rule, plan.digits)
    parts = [f'"-" ({positive})'] if plan.negative else []
    parts += ['"0"'] if plan.zero else []
    parts += [f"({positive})"] if plan.positive else []
    return " | ".join(parts)
