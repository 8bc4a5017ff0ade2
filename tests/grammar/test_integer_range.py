"""Integer bounds as GBNF: the range's expression matches exactly its integers, canonically spelled."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bubo.domain.generation import GrammarSpec
from bubo.engine._grammar import to_gbnf
from bubo.grammar._integer_range import OPEN_DIGITS, integer_bounds, integer_range

from ._gbnf_language import as_regex


def window(low: int, high: int, margin: int = 120) -> set[int]:
    """Integers around both ends and around every power of ten between them, where lengths change."""
    near = {low, high, 0} | {
        sign * 10**k for k in range(len(str(max(abs(low), abs(high)))) + 1) for sign in (1, -1)
    }
    return {n + step for n in near for step in range(-margin, margin + 1)}


integers = st.one_of(
    st.integers(-200, 200),
    st.integers(-(10**20) + 1, 10**20 - 1),
    st.integers(0, 18).map(lambda k: 10**k),
    st.integers(0, 18).map(lambda k: -(10**k)),
)


@given(integers, integers)
@example(0, 0)
@example(-1, 1)
@example(18, 120)
@example(-(10**16) + 1, 10**16 - 1)
@example(10**19, 10**20 - 1)
def test_a_range_matches_exactly_its_integers(a: int, b: int) -> None:
    """Around both bounds and every change of length: each integer in range matches, no other does."""
    low, high = min(a, b), max(a, b)
    pattern = as_regex(integer_range(low, high))
    for n in window(low, high):
        assert bool(pattern.fullmatch(str(n))) == (low <= n <= high), n


@given(integers, integers)
def test_no_other_spelling_matches(a: int, b: int) -> None:
    """Leading zeros, ``-0``, ``+``, a fraction or an exponent are never in the range's language."""
    pattern = as_regex(integer_range(min(a, b), max(a, b)))
    for n in (a, b):
        for spelling in (f"0{abs(n)}", f"-0{abs(n)}", f"+{n}", f"{n}.0", f"{n}e0", " " + str(n)):
            assert not pattern.fullmatch(spelling), spelling
    assert not pattern.fullmatch("-0")


def test_an_empty_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="no integer is between 3 and 2"):
        integer_range(3, 2)


@pytest.mark.parametrize(
    ("schema", "bounds"),
    [
        ({"minimum": 18, "maximum": 120}, (18, 120)),
        ({"exclusiveMinimum": 0}, (1, 10**OPEN_DIGITS - 1)),
        ({"exclusiveMaximum": 0}, (-(10**OPEN_DIGITS) + 1, -1)),
        ({"minimum": 1.5, "maximum": 9.5}, (2, 9)),
        ({"exclusiveMinimum": 1.5, "exclusiveMaximum": 9.5}, (2, 9)),
        ({"minimum": 3, "exclusiveMinimum": 5, "maximum": 10, "exclusiveMaximum": 8}, (6, 7)),
        ({"maximum": 10**19}, (-(10**20) + 1, 10**19)),
    ],
)
def test_bounds(schema: dict[str, float], bounds: tuple[int, int]) -> None:
    """Exclusive bounds move one integer in, fractions round inwards, an open side has 16 digits (or as
    many as the other bound)."""
    assert integer_bounds(schema) == bounds


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 18, "maximum": 120},
        {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 120}}},
        {"type": ["integer", "null"], "minimum": 18, "maximum": 120},
        {"$defs": {"age": {"type": "integer", "minimum": 18, "maximum": 120}}, "$ref": "#/$defs/age"},
    ],
)
def test_the_conversion_writes_the_range(schema: dict[str, object]) -> None:
    """Wherever a bounded integer sits, its rule is the range, not the converter's plain integer."""
    gbnf = to_gbnf(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))
    assert integer_range(18, 120) in gbnf
    assert "integral-part" not in gbnf


@pytest.mark.parametrize(
    ("schema", "constraint"),
    [
        (
            {"type": ["object", "null"], "properties": {"a": {"type": "string"}}, "required": ["a"]},
            '"\\"a\\""',
        ),
        ({"type": ["string", "null"], "pattern": "^[xyz]$"}, "[xyz]"),
        ({"type": ["string", "null"], "maxLength": 3}, "char (char (char)?)?"),
        ({"type": ["null", "integer"], "maximum": 5}, integer_range(-(10**OPEN_DIGITS) + 1, 5)),
    ],
)
def test_a_list_of_types_keeps_the_other_keywords(schema: dict[str, object], constraint: str) -> None:
    """Each type of a list is converted with the schema's other keywords, not as a bare type."""
    gbnf = to_gbnf(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))
    assert constraint in gbnf
