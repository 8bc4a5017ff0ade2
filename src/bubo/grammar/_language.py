"""Languages over characters, as the freeform tools' grammars define them (Lark, regular expressions).

An expression is a set of characters (:class:`Chars`), a string
(:class:`Text`), a sequence, a choice, a bounded or unbounded repetition, or a
reference to a named definition; :mod:`bubo.grammar.freeform` checks them and
writes them as GBNF.  Character sets are sorted, disjoint code-point ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

__all__ = [
    "ANY",
    "MAX_CODE_POINT",
    "MAX_GROUP_DEPTH",
    "Alt",
    "Chars",
    "Expr",
    "Ref",
    "Refused",
    "Repeat",
    "Seq",
    "Text",
    "chars",
    "complement",
    "either_case",
    "references",
    "subtract",
    "union",
]

MAX_CODE_POINT = 0x10FFFF
MAX_GROUP_DEPTH = 32
"""Groups inside groups in a regular expression (a schema ``pattern`` or a freeform tool's) or a Lark
rule: each is one recursion in the reader (here, or llama-cpp-python's converter) and in llama.cpp's."""

Ranges = tuple[tuple[int, int], ...]


@attrs.frozen
class Refused(ValueError):
    """Why a grammar or a pattern cannot be enforced; ``reason`` reads after "the grammar"/"the pattern"."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@attrs.frozen
class Chars:
    """One character of a set (``ranges``: sorted, disjoint, inclusive)."""

    ranges: Ranges


@attrs.frozen
class Text:
    """These characters, in order."""

    value: str


@attrs.frozen
class Seq:
    """Each item, one after the other (none: the empty string)."""

    items: tuple[Expr, ...]


@attrs.frozen
class Alt:
    """One of the options."""

    options: tuple[Expr, ...]


@attrs.frozen
class Repeat:
    """``item`` at least ``low`` times, at most ``high`` (None: no limit)."""

    item: Expr
    low: int
    high: int | None


@attrs.frozen
class Ref:
    """The definition called ``name``."""

    name: str


Expr = Chars | Text | Seq | Alt | Repeat | Ref


def chars(ranges: Iterable[tuple[int, int]]) -> Chars:
    """A set of the characters in *ranges* (in any order, overlapping or not)."""
    return Chars(_normalized(ranges))


ANY = Chars(((0, MAX_CODE_POINT),))


def _normalized(ranges: Iterable[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


def union(*sets: Chars) -> Chars:
    """The characters of any of *sets*."""
    return chars(r for s in sets for r in s.ranges)


def complement(characters: Chars) -> Chars:
    """Every character not in *characters*."""
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in characters.ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return Chars(tuple(out))


def subtract(characters: Chars, removed: Chars) -> Chars:
    """The characters of *characters* that are not in *removed*."""
    keep = complement(removed).ranges
    out: list[tuple[int, int]] = []
    for low, high in characters.ranges:
        for k_low, k_high in keep:
            if k_low > high:
                break
            if k_high >= low:
                out.append((max(low, k_low), min(high, k_high)))
    return Chars(tuple(out))


def either_case(characters: Chars) -> Chars:
    """*characters* with the other case of their ASCII letters added (a case-insensitive match)."""
    extra: list[tuple[int, int]] = []
    for low, high in characters.ranges:
        for first, shift in ((ord("a"), -32), (ord("A"), 32)):
            a, b = max(low, first), min(high, first + 25)
            if a <= b:
                extra.append((a + shift, b + shift))
    return chars((*characters.ranges, *extra))


def references(expr: Expr) -> Iterator[str]:
    """The names *expr* refers to (once per reference)."""
    stack: list[Expr] = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, Ref):
            yield item.name
        elif isinstance(item, Seq):
            stack.extend(item.items)
        elif isinstance(item, Alt):
            stack.extend(item.options)
        elif isinstance(item, Repeat):
            stack.append(item.item)
