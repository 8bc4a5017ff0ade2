"""GBNF for the multiples of an integer: JSON schema's ``multipleOf``, enforced while sampling.

Divisibility by *c* is regular: reading a number's digits from the left, the
remainder so far is all that matters (``r`` then digit ``d`` is ``(10r + d) mod c``).
So the multiples are a grammar with one rule per remainder and number of digits
still allowed (the length is bounded as the converter's plain ``integer`` is, at
:data:`~._integer_range.OPEN_DIGITS` digits).  Trailing zeros of the divisor
are literal zeros (multiples of 500 are multiples of 5 and ``00``), so only the
rest, :data:`MAX_DIVISOR` at most, costs rules.

Bounds beside ``multipleOf`` are written two ways: bounds that only fix the
sign (``minimum: 0``, ``exclusiveMinimum: 0``, ``maximum: 0`` …) drop ``-`` or
zero from the automaton; a range with at most :data:`MAX_LISTED` multiples is
spelled as their list, shared prefixes merged.  Any other combination is
refused by :func:`bubo.grammar.check_schema` (:func:`multiples_plan` says which).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ._integer_range import OPEN_DIGITS

__all__ = ["MAX_DIVISOR", "MAX_LISTED", "Multiples", "divisible", "multiples_plan", "stripped", "trie"]

MAX_DIVISOR = 100
"""The divisor without its trailing zeros: c remainders x 16 lengths rules.  Measured (llama-cpp-python
0.3.36): 7 is 110 rules, 15 KB of GBNF, 3 ms to convert and 3 ms to parse; 99 is 1,302 rules, 250 KB,
42 ms and 47 ms.  The distinct divisors of one schema share the same budget
(:attr:`bubo.grammar.schema.SchemaLimits.divisors`)."""
MAX_LISTED = 500
"""Multiples of a bounded range written out as a list (their characters are bounded by 21 each)."""


@attrs.frozen
class Multiples:
    """Which multiples of ``divisor`` a schema admits, and how they are written.

    ``listed`` is the range's multiples when they are few enough to write out;
    otherwise the automaton, with ``negative``/``zero``/``positive`` saying which signs it admits.
    """

    divisor: int
    negative: bool = True
    zero: bool = True
    positive: bool = True
    listed: tuple[int, ...] | None = None
    digits: int = OPEN_DIGITS


def multiples_plan(divisor: int, low: int, high: int, widest: int) -> Multiples | None:
    """How to write the multiples of *divisor* from *low* to *high*; None if no grammar within the limits can.

    *widest* is the largest magnitude an open side allows, ``10^digits - 1`` (``low == -widest`` is no
    lower bound).
    """
    first, last = -((-low) // divisor) * divisor, (high // divisor) * divisor
    count = max(0, (last - first) // divisor + 1)
    if count <= MAX_LISTED:
        return Multiples(divisor, listed=tuple(range(first, last + 1, divisor)) if count else ())
    top = widest // divisor * divisor
    digits = len(str(widest))
    if widest != 10**digits - 1 or first not in (-top, 0, divisor) or last not in (top, 0, -divisor):
        return None
    return Multiples(divisor, negative=first < 0, zero=first <= 0 <= last, positive=last > 0, digits=digits)


def trie(spellings: list[str]) -> str:
    """A GBNF expression for exactly *spellings*, alternatives sharing a first character merged."""
    if spellings == [""]:
        return '""'
    groups: dict[str, list[str]] = {}
    ends = False
    for spelling in spellings:
        if spelling:
            groups.setdefault(spelling[0], []).append(spelling[1:])
        else:
            ends = True
    alternatives = []
    for head, tails in groups.items():
        rest = [tail for tail in tails if tail]
        if not rest:
            alternatives.append(f'"{head}"')
        elif len(rest) < len(tails):
            alternatives.append(f'"{head}" ({trie(rest)})?')
        else:
            alternatives.append(f'"{head}" ({trie(rest)})')
    body = " | ".join(alternatives)
    return f"({body})?" if ends else body


def stripped(divisor: int) -> tuple[int, int]:
    """*divisor* without its trailing zeros, and how many there were."""
    zeros = 0
    while divisor % 10 == 0:
        divisor //= 10
        zeros += 1
    return divisor, zeros


def divisible(divisor: int, add_rule: Callable[[str, str], str], digits: int = OPEN_DIGITS) -> str:
    """An expression for the positive multiples of *divisor* of up to *digits* digits (rules via *add_rule*).

    The rules are named after the divisor without its trailing zeros (``multiple-7-r3-12``: remainder 3,
    12 digits left), so every schema with that divisor shares them.
    """
    divisor, zeros = stripped(divisor)
    name = f"multiple-{divisor}"
    digits -= zeros
    # alive[k]: the remainders from which some k or fewer more digits reach remainder 0
    alive = [{0}]
    for _ in range(digits):
        alive.append(
            {
                r
                for r in range(divisor)
                if r == 0 or any((10 * r + d) % divisor in alive[-1] for d in range(10))
            }
        )
    names: dict[tuple[int, int], str] = {}

    def state(remainder: int, left: int) -> str:
        key = (remainder, left)
        if key not in names:  # a state leads only to states with fewer digits left: no cycle
            branches = _branches(divisor, remainder, left, alive, state)
            body = " | ".join(branches)
            if remainder == 0:
                body = f"({body})?" if branches else '""'
            names[key] = add_rule(f"{name}-r{remainder}-{left}", body)
        return names[key]

    first = [
        (digit_class, next_remainder)
        for digit_class, next_remainder in _by_remainder(divisor, 0, range(1, 10))
        if digits >= 1 and next_remainder in alive[digits - 1]
    ]
    tail = f' "{"0" * zeros}"' if zeros else ""
    return " | ".join(f"{cls} {state(r, digits - 1)}{tail}" for cls, r in first)


def _branches(
    divisor: int, remainder: int, left: int, alive: list[set[int]], state: Callable[[int, int], str]
) -> list[str]:
    if left == 0:
        return []
    return [
        f"{digit_class} {state(next_remainder, left - 1)}"
        for digit_class, next_remainder in _by_remainder(divisor, remainder, range(10))
        if next_remainder in alive[left - 1]
    ]


def _by_remainder(divisor: int, remainder: int, digits: range) -> list[tuple[str, int]]:
    """The digits after *remainder*, grouped by the remainder they lead to, each group a character class."""
    groups: dict[int, list[int]] = {}
    for digit in digits:
        groups.setdefault((10 * remainder + digit) % divisor, []).append(digit)
    return [(f"[{''.join(map(str, ds))}]", r) for r, ds in sorted(groups.items())]
