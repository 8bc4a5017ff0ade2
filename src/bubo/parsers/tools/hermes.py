"""Hermes/Qwen2.5 calls: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``.

Also accepted, as the very first thing in an answer: the same object bare or
in a ```` ```json ```` fence, or an array of them (small Qwen coder models drop
the tags).  This is the format of Bubo's generic tool section too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import ToolSpec
from bubo.grammar import THINK_BODY, literal
from bubo.grammar.freeform import json_arguments
from bubo.parsers.base import ParserConfig

from ._calls import ParsedCall, calls_from_json
from ._stream import CallStreamParser, Tags, json_scanner

__all__ = ["HermesParser", "call_grammar"]

START = "<tool_call>"
END = "</tool_call>"


def _body(text: str, config: ParserConfig) -> list[ParsedCall] | None:
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    return calls_from_json(value, config, known_only=False)


class HermesParser(CallStreamParser):
    """Tagged calls, plus a leading bare or fenced JSON call."""

    def __init__(self, config: ParserConfig) -> None:
        super().__init__(
            config, tags=Tags(START, END, _body, scanner=json_scanner, json_body=True), leading_json=True
        )


def call_grammar(tools: Sequence[ToolSpec], *, prefix: str, max_calls: int | None) -> GrammarSpec:
    """A grammar that admits only well-formed calls of *tools*, their arguments per schema."""
    rules = []
    for index, tool in enumerate(tools):
        head = literal(f'{START}\n{{"name": {json.dumps(tool.name)}, "arguments": ')
        rules.append(f"call-{index} ::= {head} args-{index} {literal('}' + chr(10) + END)}")
    freeform, schemas = json_arguments(tools)
    calls = " | ".join(f"call-{i}" for i in range(len(tools)))
    repeat = " ws" if max_calls == 1 else " ( ws call )* ws"
    root = f"root ::= {prefix}call{repeat}\ncall ::= {calls}\n" + "\n".join(rules) + "\n" + THINK_BODY
    return GrammarSpec(rules=root + freeform, schemas=schemas)
