"""What a request's grammar text costs to read grows linearly with its length (issue 36).

A schema ``pattern``, a freeform tool's regex or Lark grammar, a request's own
GBNF, and the GBNF Bubo hands llama.cpp are each read in one pass; these
compare an input of n characters with one of 4n (tests/_linear.py), hypothesis
choosing what repeats.  Lark and regex definitions are also bounded
(``MAX_DEFINITION_CHARS``), so n stays below that bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bubo.engine import EngineError
from bubo.engine._grammar import check_gbnf
from bubo.errors import BuboError
from bubo.grammar._language import Refused
from bubo.grammar._lark import parse_lark
from bubo.grammar._regex import parse_regex
from bubo.grammar.freeform import MAX_DEFINITION_CHARS
from bubo.grammar.gbnf import check_request_grammar
from bubo.grammar.pattern import check_pattern

from .._linear import assert_linear

N = MAX_DEFINITION_CHARS // 8
# pieces of grammar text that open, close, escape or quantify; repeated without end
UNITS = st.sampled_from(["(", ")", "[", "]", "a", "a*", "(a|b)", "\\", "\\d", "{", "{1", "{2,3}", '"', "/", "#",
                         "::=", "|", "?", "x{1}", "[^a]", "\n", " ", "(?:", "a+?"]) | st.text(
    alphabet='()[]{}|*+?\\"/#:=,0123456789ab \n^$', min_size=1, max_size=5
)  # fmt: skip
slow = settings(max_examples=4, deadline=None)


def refused_or_read(read: Callable[[str], object]) -> Callable[[str], None]:
    """*read*, its refusal (a 400 where a request sent the text; the engine's GrammarRejected) counted as reading."""

    def run(text: str) -> None:
        with contextlib.suppress(Refused, BuboError, EngineError):
            read(text)

    return run


def repeated(prefix: str, unit: str, suffix: str = "") -> Callable[[int], str]:
    return lambda n: prefix + unit * (n // len(unit) + 1) + suffix


@slow
@given(UNITS)
@example("(a)")
@example("a{1}")
def test_a_schema_pattern(unit: str) -> None:
    assert_linear(repeated("^", unit, "$"), refused_or_read(lambda p: check_pattern(p, max_repeat=100)), N)


@slow
@given(UNITS)
@example("[a-z]")
def test_a_freeform_regex(unit: str) -> None:
    assert_linear(repeated("", unit), refused_or_read(parse_regex), N)


@slow
@given(UNITS, st.sampled_from(["start: ", 'start: "a" ', "start: /", "start: (", "start: a\na: "]))
@example(" ", "start: ")
@example('"a" | ', "start: ")
def test_a_lark_grammar(unit: str, prefix: str) -> None:
    assert_linear(repeated(prefix, unit), refused_or_read(parse_lark), N)


@slow
@given(UNITS)
@example('"')
@example("[")
@example("a ::= b\n")
def test_a_request_gbnf_and_the_grammar_for_llama_cpp(unit: str) -> None:
    """The rules are counted and the groups' depth measured, each in one scan."""
    count = refused_or_read(lambda rules: check_request_grammar(rules, "grammar"))
    assert_linear(repeated("root ::= ", unit), count, 8 * N)
    assert_linear(repeated("root ::= ", unit), refused_or_read(check_gbnf), 8 * N)
