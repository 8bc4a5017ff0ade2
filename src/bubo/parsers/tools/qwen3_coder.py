"""Qwen3-Coder calls: XML parameters inside ``<tool_call>``.

```
<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
</function>
</tool_call>
```

A parameter whose schema type is ``string`` keeps its text; any other value is
read as JSON (numbers, booleans, objects), falling back to the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import ToolSpec
from bubo.grammar import THINK_BODY, literal
from bubo.parsers.base import ParserConfig

from ._calls import ParsedCall, compact_json
from ._stream import CallStreamParser, Tags

__all__ = ["Qwen3CoderParser", "call_grammar"]

START = "<tool_call>"
END = "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _value(text: str, schema: Mapping[str, Any] | None) -> Any:
    if schema is not None and schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _body(text: str, config: ParserConfig) -> list[ParsedCall] | None:
    match = _FUNCTION.match(text)
    if match is None:
        return None
    name, inner = match.group(1).strip(), match.group(2)
    tool = config.tool(name)
    properties: Mapping[str, Any] = (tool.parameters.get("properties") or {}) if tool else {}
    arguments = {
        key.strip(): _value(value, properties.get(key.strip())) for key, value in _PARAMETER.findall(inner)
    }
    if _PARAMETER.sub("", inner).strip():  # something that is not a parameter
        return None
    return [ParsedCall(name=name, arguments=compact_json(arguments))]


class Qwen3CoderParser(CallStreamParser):
    """XML-parameter calls inside ``<tool_call>`` tags."""

    def __init__(self, config: ParserConfig) -> None:
        super().__init__(config, tags=Tags(START, END, _body), leading_json=False)


def call_grammar(tools: Sequence[ToolSpec], *, prefix: str, max_calls: int | None) -> GrammarSpec:
    """Calls with each property as a ``<parameter=…>`` block; JSON-typed values follow their schema."""
    rules = ['text-value ::= ( [^<] | "<" [^/] )*']
    schemas: list[tuple[str, dict[str, Any]]] = []
    for index, tool in enumerate(tools):
        properties: Mapping[str, Any] = tool.parameters.get("properties") or {}
        required = set(tool.parameters.get("required") or ())
        parts = []
        for number, (key, schema) in enumerate(properties.items()):
            if isinstance(schema, Mapping) and schema.get("type") == "string":
                value = "text-value"
            else:
                value = f"value-{index}-{number}"
                schemas.append((value, dict(schema) if isinstance(schema, Mapping) else {}))
            opening, closing = literal(f"<parameter={key}>\n"), literal("\n</parameter>\n")
            block = f"{opening} {value} {closing}"
            parts.append(block if key in required else f"( {block} )?")
        head = literal(f"{START}\n<function={tool.name}>\n")
        rules.append(f"call-{index} ::= {head} {' '.join(parts)} {literal('</function>' + chr(10) + END)}")
    calls = " | ".join(f"call-{i}" for i in range(len(tools)))
    repeat = " ws" if max_calls == 1 else " ( ws call )* ws"
    root = f"root ::= {prefix}call{repeat}\ncall ::= {calls}\n" + "\n".join(rules) + "\n" + THINK_BODY
    return GrammarSpec(rules=root, schemas=tuple(schemas))
