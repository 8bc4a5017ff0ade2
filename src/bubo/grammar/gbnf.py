"""Small GBNF helpers shared by the tool-call formats and structured output."""

from __future__ import annotations

import re

from bubo.errors import InvalidRequest

__all__ = ["MAX_REQUEST_RULES", "THINK_BODY", "check_request_grammar", "literal", "thinking_prefix"]

MAX_REQUEST_RULES = 1_000
"""Rules in a grammar a request sends itself (llama-server's ``grammar``).  llama.cpp follows a rule
that starts with a reference to another with one C++ recursion each: a chain of 100,000 such rules
killed the process with SIGSEGV, 10,000 parsed (in 3.4 s).  A chain is at most as long as the rules."""

# a "literal", a [class] or a # comment (where ::= means nothing), or a rule definition; linear, as in
# bubo.engine._grammar: an unclosed literal or class runs to the end
_DEFINITIONS = re.compile(
    r'"(?:\\.|[^"\\])*(?:"|\\?\Z)|\[(?:\\.|[^\]\\])*(?:\]|\\?\Z)|#[^\r\n]*|::=', re.DOTALL
)

THINK_BODY = 'think-body ::= ( [^<] | "<" [^/] )*\nws ::= [ \\t\\n]{0,8}\n'
"""Reasoning text: anything without ``</`` (so only ``</think>`` ends it), and bounded
whitespace (an unbounded rule would let a model pad with newlines until the context ends)."""

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """*text* as a quoted GBNF string literal."""
    return '"' + "".join(_ESCAPES.get(char, char) for char in text) + '"'


def check_request_grammar(rules: str, param: str) -> None:
    """Refuse a request's own GBNF with more than :data:`MAX_REQUEST_RULES` rules (one linear scan).

    Grammars Bubo writes itself are bounded by the schema limits; the operator's
    ``--grammar-file`` is trusted.

    Raises:
        InvalidRequest: ``schema_too_complex``, naming *param*.

    """
    defined = sum(1 for token in _DEFINITIONS.finditer(rules) if token.group() == "::=")
    if defined > MAX_REQUEST_RULES:
        raise InvalidRequest(
            f"the grammar defines {defined} rules, more than {MAX_REQUEST_RULES}",
            code="schema_too_complex",
            param=param,
        )


def thinking_prefix(*, starts_inside: bool, may_think: bool) -> str:
    """The GBNF to put before the constrained output so a thinking model may think first.

    Inside an already opened ``<think>``: reasoning, ``</think>``, whitespace.
    Before it (a template that lets the model open it): all of that, optional.
    """
    if starts_inside:
        return 'think-body "</think>" ws '
    if may_think:
        return '( "<think>" think-body "</think>" ws )? '
    return ""
