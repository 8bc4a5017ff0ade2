"""The GBNF guard in front of llama.cpp's recursive parser: nesting and size, read as GBNF reads them."""

from __future__ import annotations

import pytest

from bubo.engine import GrammarRejected
from bubo.engine._grammar import MAX_GBNF_CHARS, MAX_GBNF_NESTING, check_gbnf


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def test_nesting_up_to_the_limit_passes() -> None:
    """MAX_GBNF_NESTING groups in groups are fine; one more is a 400 naming both numbers."""
    check_gbnf(nested(MAX_GBNF_NESTING))
    with pytest.raises(GrammarRejected) as caught:
        check_gbnf(nested(MAX_GBNF_NESTING + 1))
    assert caught.value.code == "schema_too_complex"
    assert f"{MAX_GBNF_NESTING + 1} deep; at most {MAX_GBNF_NESTING}" in caught.value.message


@pytest.mark.parametrize(
    "hidden",
    [
        '"' + "(" * 5000 + '"',  # inside a literal
        '"\\"' + "(" * 5000 + '"',  # after an escaped quote, still inside
        "[(" + "(" * 5000 + "]",  # inside a character class
        "[\\]" + "(" * 5000 + "]",  # after an escaped ], still inside
        "# " + "(" * 5000 + '\n  "x"',  # in a comment
    ],
)
def test_parentheses_that_are_not_groups_do_not_count(hidden: str) -> None:
    """Parentheses in literals, classes and comments are characters, not groups."""
    check_gbnf(f"root ::= {hidden}")


def test_size() -> None:
    """More than MAX_GBNF_CHARS characters is refused before any parsing."""
    with pytest.raises(GrammarRejected, match=f"at most {MAX_GBNF_CHARS} are supported"):
        check_gbnf('root ::= "' + "a" * MAX_GBNF_CHARS + '"')
