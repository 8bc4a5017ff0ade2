"""Number bounds and multipleOf as GBNF: each expression matches exactly the values in range, as doubles read them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bubo.domain.generation import GrammarSpec
from bubo.engine._grammar import to_gbnf
from bubo.grammar._multiples import trie
from bubo.grammar._number_range import FRACTION_DIGITS, number_bounds, number_range
from bubo.grammar.numeric import NumericRefused, check_numeric, step

from ._gbnf_language import as_regex


def spellings(units: int, digits: int) -> list[str]:
    """Every spelling of ``units x 10^-digits`` with 0 to ``digits + 1`` fraction digits (trailing zeros)."""
    value, found = Fraction(units, 10**digits), []
    for count in range(digits + 2):
        scaled = value * 10**count
        if scaled.denominator == 1:
            magnitude = abs(int(scaled))
            whole, fraction = divmod(magnitude, 10**count)
            sign = "-" if value < 0 else ""
            found.append(sign + str(whole) + (f".{fraction:0{count}d}" if count else ""))
    return found


scaled = st.one_of(st.integers(-3000, 3000), st.integers(-(10**24), 10**24))


@given(scaled, scaled, st.integers(1, 4))
@example(5, 95, 1)
@example(-105, 95, 1)
@example(0, 0, 2)
@example(-(10**8) + 1, 10**8 - 1, 2)
def test_a_range_matches_exactly_its_decimals(a: int, b: int, digits: int) -> None:
    """Around both ends, zero and each whole number between: every spelling in range matches (trailing zeros
    too), no value outside does, and no spelling with more fraction digits than the range has."""
    low, high = min(a, b), max(a, b)
    pattern = as_regex(number_range(low, high, digits))
    unit = 10**digits
    near = {low, high, 0, low // unit * unit, high // unit * unit, (low // unit + 1) * unit}
    for units in {n + offset for n in near for offset in range(-25, 26)}:
        for spelling in spellings(units, digits):
            expected = low <= units <= high and len(spelling.partition(".")[2]) <= digits
            assert bool(pattern.fullmatch(spelling)) == expected, (spelling, low, high)


@given(scaled, scaled, st.integers(1, 4))
def test_no_other_spelling_matches(a: int, b: int, digits: int) -> None:
    """No ``-0``, leading zero, ``+``, exponent, bare ``.``: JSON's canonical decimals only."""
    pattern = as_regex(number_range(min(a, b), max(a, b), digits))
    for spelling in ("-0", "-0.0", "00", "01", "1.", ".5", "1e5", "1E0", "+1", " 1", "0.5 "):
        assert not pattern.fullmatch(spelling), spelling


def test_an_empty_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="no number is between 3 and 2"):
        number_range(3, 2, 1)


@pytest.mark.parametrize(
    ("schema", "digits", "bounds"),
    [
        ({"minimum": 0.5, "maximum": 9.5}, 1, (5, 95)),
        ({"minimum": 0.1}, 16, (10**15, 10**32 - 1)),  # the decimal the client wrote, not the double's value
        ({"exclusiveMinimum": 0.5}, 16, (5 * 10**15 + 1, 10**32 - 1)),  # past the next double's midpoint
        ({"exclusiveMinimum": 0}, 2, (1, 10**18 - 1)),
        ({"exclusiveMaximum": 0}, 2, (-(10**18) + 1, -1)),
        ({"minimum": 0.015, "maximum": 0.075}, 2, (2, 7)),  # rounded inwards to the fraction digits
        ({"maximum": 10**19}, 1, (-(10**21) + 1, 10**20)),  # the open side as long as the other
    ],
)
def test_bounds(schema: dict[str, float], digits: int, bounds: tuple[int, int]) -> None:
    assert number_bounds(schema, digits) == bounds


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e19, max_value=1e19)


@given(finite)
@example(0.5)
@example(0.1)
@example(0.0)
@example(1e15 + 0.5)
@example(5e-324)
def test_bounds_hold_for_doubles(bound: float) -> None:
    """The least and greatest decimal admitted read, as doubles, on the right side of each bound."""
    at_least, _ = number_bounds({"minimum": bound})
    above, _ = number_bounds({"exclusiveMinimum": bound})
    _, at_most = number_bounds({"maximum": bound})
    _, below = number_bounds({"exclusiveMaximum": bound})
    as_double = lambda units: float(Fraction(units, 10**FRACTION_DIGITS))  # noqa: E731
    assert as_double(at_least) >= bound
    assert as_double(above) > bound
    assert as_double(at_most) <= bound
    assert as_double(below) < bound
    assert Fraction(above, 10**FRACTION_DIGITS) > Fraction(bound)  # and as exact decimals
    assert Fraction(below, 10**FRACTION_DIGITS) < Fraction(bound)


@pytest.mark.parametrize(
    ("multiple", "decomposed"),
    [(5, (5, 0)), (5.0, (5, 0)), (0.01, (1, 2)), (0.5, (5, 1)), (2.5e-7, (25, 8)), (1e-16, (1, 16))],
)
def test_step(multiple: float, decomposed: tuple[int, int]) -> None:
    """A multiple is read as the decimal the client wrote: c x 10^-k."""
    assert step(multiple) == decomposed


def test_a_list_of_multiples_matches_exactly_them() -> None:
    values = [str(n) for n in range(-35, 101, 5)]
    pattern = as_regex(trie(values))
    assert [n for n in range(-200, 300) if pattern.fullmatch(str(n))] == list(range(-35, 101, 5))


@pytest.mark.parametrize(
    ("schema", "constraint"),
    [
        (
            {"type": "number", "minimum": 0.5, "maximum": 9.5},
            number_range(*number_bounds({"minimum": 0.5, "maximum": 9.5})),
        ),
        ({"type": ["number", "null"], "minimum": 0, "maximum": 1, "multipleOf": 0.1}, number_range(0, 10, 1)),
        ({"type": "number", "multipleOf": 1, "minimum": 1, "maximum": 3}, "[1-3]"),
        (
            {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 20},
            '"0" | "5" | "1" ("0" | "5") | "2" ("0")',
        ),
        ({"type": "integer", "multipleOf": 7}, "multiple-7-r0-15"),
        ({"type": "integer", "multipleOf": 700, "exclusiveMinimum": 0}, '"00"'),
    ],
)
def test_the_conversion_writes_the_constraint(schema: dict[str, object], constraint: str) -> None:
    """Wherever such a number sits, its rule is the constraint, not the converter's plain number."""
    gbnf = to_gbnf(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))
    assert constraint in gbnf
    assert "decimal-part" not in gbnf


@pytest.mark.parametrize(
    ("schema", "kind", "keyword", "words"),
    [
        ({"multipleOf": 0.5}, "number", "multipleOf", "only a whole number or 1, 0.1, 0.01"),
        ({"multipleOf": 0.5}, "integer", "multipleOf", "on an integer it must be a whole number"),
        ({"multipleOf": 3, "minimum": 1, "maximum": 1503}, "integer", "minimum", "at most 500 multiples"),
        ({"multipleOf": 3, "minimum": 1, "exclusiveMaximum": 3}, "integer", "minimum", "no multiple of 3"),
        (
            {"exclusiveMinimum": 0.5, "exclusiveMaximum": 0.5},
            "number",
            "exclusiveMinimum",
            "admits no number",
        ),
    ],
)
def test_what_no_grammar_writes_is_refused(
    schema: dict[str, object], kind: str, keyword: str, words: str
) -> None:
    with pytest.raises(NumericRefused) as refused:
        check_numeric(schema, kind)
    assert refused.value.keyword == keyword
    assert words in refused.value.reason
