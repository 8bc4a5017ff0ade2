"""Small GBNF helpers shared by the tool-call formats and structured output."""

from __future__ import annotations

__all__ = ["THINK_BODY", "literal", "thinking_prefix"]

THINK_BODY = 'think-body ::= ( [^<] | "<" [^/] )*\nws ::= [ \\t\\n]{0,8}\n'
"""Reasoning text: anything without ``</`` (so only ``</think>`` ends it), and bounded
whitespace (an unbounded rule would let a model pad with newlines until the context ends)."""

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """*text* as a quoted GBNF string literal."""
    return '"' + "".join(_ESCAPES.get(char, char) for char in text) + '"'


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
