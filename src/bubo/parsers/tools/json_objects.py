"""Bare or fenced JSON calls: ``{"name": …, "arguments": {…}}`` (or a list) as the answer itself."""

from __future__ import annotations

import json
from collections.abc import Sequence

from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import ToolSpec
from bubo.grammar import THINK_BODY, literal
from bubo.grammar.freeform import json_arguments
from bubo.parsers.base import ParserConfig

from ._stream import CallStreamParser

__all__ = ["JsonObjectsParser", "call_grammar"]


class JsonObjectsParser(CallStreamParser):
    """Only a leading JSON value (bare or fenced) can be a call."""

    def __init__(self, config: ParserConfig) -> None:
        super().__init__(config, tags=None, leading_json=True)


def call_grammar(tools: Sequence[ToolSpec], *, prefix: str, max_calls: int | None) -> GrammarSpec:
    """One call object, or (when parallel calls are allowed) an array of them."""
    rules = []
    for index, tool in enumerate(tools):
        head = literal('{"name": ' + json.dumps(tool.name) + ', "arguments": ')
        rules.append(f"call-{index} ::= {head} args-{index} {literal('}')}")
    freeform, schemas = json_arguments(tools)
    calls = " | ".join(f"call-{i}" for i in range(len(tools)))
    body = "call" if max_calls == 1 else 'call | "[" ws call ( "," ws call )* ws "]"'
    root = f"root ::= {prefix}( {body} )\ncall ::= {calls}\n" + "\n".join(rules) + "\n" + THINK_BODY
    return GrammarSpec(rules=root + freeform, schemas=schemas)
