"""A request's own GBNF is bounded in rules: llama.cpp recurses once per rule along a chain of them."""

from __future__ import annotations

import pytest

from bubo.api._nesting import check_arguments_depth
from bubo.engine._grammar import check_gbnf
from bubo.errors import InvalidRequest
from bubo.grammar import MAX_REQUEST_RULES, check_request_grammar


def chain(length: int) -> str:
    """Rules each starting with a reference to the next (100,000 of them crashed llama.cpp)."""
    return "".join(f'r{i} ::= r{i + 1} "x"\n' for i in range(length)) + f'r{length} ::= "y"\n'


def test_a_long_chain_is_refused_before_llama_cpp_sees_it() -> None:
    with pytest.raises(InvalidRequest, match="more than 1000") as caught:
        check_request_grammar("root ::= r0\n" + chain(100_000), "grammar")
    assert (caught.value.code, caught.value.param) == ("schema_too_complex", "grammar")


def test_the_limit_itself_is_allowed() -> None:
    check_request_grammar("root ::= r0\n" + chain(MAX_REQUEST_RULES - 2), "grammar")


def test_definitions_inside_literals_classes_and_comments_do_not_count() -> None:
    quoted = 'root ::= "::=" | [:=] # ::= ::=\n' * 1
    check_request_grammar(quoted + '"' + "::= " * (2 * MAX_REQUEST_RULES), "grammar")  # an unclosed literal


UNCLOSED_QUOTE = '"' + '\\"' * 50_000 + "[]" * 65


def test_an_unclosed_string_in_arguments_runs_to_the_end() -> None:
    """The scanner reads it once: the brackets after an unclosed quote are inside the string."""
    assert check_arguments_depth(UNCLOSED_QUOTE, "arguments") == UNCLOSED_QUOTE


@pytest.mark.parametrize("text", [UNCLOSED_QUOTE, "[" * 100_000])
def test_an_unclosed_literal_or_class_in_gbnf_runs_to_the_end(text: str) -> None:
    check_gbnf("root ::= " + text)
