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
read as JSON (numbers, booleans, objects), falling back to the text.  The call
starts once ``<function=NAME>`` is written; a string parameter streams as it
is generated, any other when its ``</parameter>`` closes it.

Each character is read about once: a ``<function=…>`` or ``<parameter=…>``
tag still open after :data:`~._json_calls.MAX_HEAD_CHARS` characters is given
up on (the body is read whole; a parameter tag is dropped), and a whole body's
parameters are read by one scan (a regular expression that looked for each
``</parameter>`` from every ``<parameter=`` was quadratic).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import ToolSpec
from bubo.domain.output import OutputEvent
from bubo.grammar import THINK_BODY, literal
from bubo.grammar.freeform import input_rules
from bubo.parsers.base import ParserConfig, hold_partial

from ._calls import Emitter, ParsedCall, compact_json
from ._json_calls import MAX_HEAD_CHARS
from ._stream import CallStreamParser, Tags, Verdict

__all__ = ["Qwen3CoderParser", "call_grammar"]

START = "<tool_call>"
END = "</tool_call>"
# linear: the lazy body stops at each "</function>" once, and what follows it is white space to the end
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.DOTALL)


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
    parameters = _parameters(inner)
    if parameters is None:
        return None
    arguments = {key.strip(): _value(value, properties.get(key.strip())) for key, value in parameters}
    return [ParsedCall(name=name, arguments=compact_json(arguments))]


def _parameters(inner: str) -> list[tuple[str, str]] | None:
    """The ``<parameter=KEY>VALUE</parameter>`` blocks of a function's body, in one scan.

    A newline right after the opening tag and one right before the closing tag
    are not the value's.  None when the body holds anything else but white
    space between the blocks (a tag that is not closed included).
    """
    found: list[tuple[str, str]] = []
    pos = 0
    while (start := inner.find(_OPEN_PARAMETER, pos)) != -1:
        if inner[pos:start].strip():
            return None
        key_start = start + len(_OPEN_PARAMETER)
        key_end = inner.find(">", key_start)
        if key_end in (-1, key_start) or "\n" in inner[key_start:key_end]:
            return None
        value_start = key_end + 1 + inner.startswith("\n", key_end + 1)
        value_end = inner.find(_CLOSE_PARAMETER, value_start)
        if value_end == -1:
            return None
        found.append((inner[key_start:key_end], inner[value_start:value_end].removesuffix("\n")))
        pos = value_end + len(_CLOSE_PARAMETER)
    return None if inner[pos:].strip() else found


_OPEN_FUNCTION = "<function="
_CLOSE_FUNCTION = "</function>"
_OPEN_PARAMETER = "<parameter="
_CLOSE_PARAMETER = "</parameter>"


class XmlCallScanner:
    """One ``<function=…>`` body read as it is written, its parameters passed on as JSON."""

    def __init__(self, config: ParserConfig, emitter: Emitter) -> None:
        self._config = config
        self._emitter = emitter
        self.verdict = Verdict.UNDECIDED
        self.held = ""
        self.rest = ""
        self._buffer = ""
        self._index: int | None = None
        self._properties: Mapping[str, Any] = {}
        self._opened = False  # the arguments' "{" was written
        self._parameter: str | None = None  # the parameter whose value is being read
        self._streams_text = False  # that value is a string, written as it comes
        self._value: list[str] = []  # a non-string value so far
        self._value_started = False  # past the newline that follows a parameter's opening tag

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume text; the call's start and its arguments as they become known."""
        events: list[OutputEvent] = []
        if self.verdict is Verdict.UNDECIDED:
            self.held += text
            self._head(events)
            text, self._buffer = self._buffer, ""
        if self.verdict is not Verdict.STREAMING:
            return events
        self._buffer += text
        while self.verdict is Verdict.STREAMING and self._advance(events):
            pass
        return events

    def _head(self, events: list[OutputEvent]) -> None:
        stripped = self.held.lstrip()
        if len(stripped) < len(_OPEN_FUNCTION) and _OPEN_FUNCTION.startswith(stripped):
            if len(self.held) > MAX_HEAD_CHARS:  # white space without end: read whole
                self.verdict, self.rest = Verdict.WHOLE, ""
            return
        close = stripped.find(">")
        if (
            not stripped.startswith(_OPEN_FUNCTION)
            or (close == -1 and "\n" in stripped)
            or (close == -1 and len(self.held) > MAX_HEAD_CHARS)
        ):
            self.verdict, self.rest, self.held = Verdict.WHOLE, "", self.held
            return
        if close == -1:
            return
        name = stripped[len(_OPEN_FUNCTION) : close].strip()
        tool = self._config.tool(name)
        self._properties = (tool.parameters.get("properties") or {}) if tool else {}
        self.verdict, self.held = Verdict.STREAMING, ""
        self._buffer = stripped[close + 1 :]
        self._index = self._emitter.start(name, events)

    def _advance(self, events: list[OutputEvent]) -> bool:
        """Read what the buffer holds; whether to go on."""
        if self._parameter is not None:
            return self._read_value(events)
        stripped = self._buffer = self._buffer.lstrip()  # white space between parameters is nobody's
        if stripped.startswith(_CLOSE_FUNCTION):
            self._emit("}" if self._opened else "{}", events)
            self.verdict, self.rest = Verdict.DONE, stripped[len(_CLOSE_FUNCTION) :]
            return False
        if stripped.startswith(_OPEN_PARAMETER):
            return self._open_parameter(stripped, events)
        if any(m.startswith(stripped) for m in (_CLOSE_FUNCTION, _OPEN_PARAMETER)):
            return False  # a marker being written
        skip = stripped.find("<", 1)  # something that is no parameter: dropped
        self._buffer = "" if skip == -1 else stripped[skip:]
        return skip != -1

    def _open_parameter(self, stripped: str, events: list[OutputEvent]) -> bool:
        """``<parameter=KEY>`` at the start of *stripped*: the value is read next; whether to go on."""
        close = stripped.find(">")
        if close == -1 and len(stripped) > MAX_HEAD_CHARS:  # no parameter's tag: dropped
            self._buffer = stripped[len(_OPEN_PARAMETER) :]
            return True
        if close == -1:
            return False
        key = stripped[len(_OPEN_PARAMETER) : close].strip()
        self._emit(("," if self._opened else "{") + json.dumps(key, ensure_ascii=False) + ":", events)
        self._opened = True
        self._parameter = key
        schema = self._properties.get(key)
        self._streams_text = isinstance(schema, Mapping) and schema.get("type") == "string"
        self._value, self._value_started = [], False
        self._buffer = stripped[close + 1 :]
        if self._streams_text:
            self._emit('"', events)
        return bool(self._buffer)

    def _read_value(self, events: list[OutputEvent]) -> bool:
        if not self._value_started:  # the newline after the opening tag is not the value's
            if not self._buffer:
                return False
            self._buffer, self._value_started = self._buffer.removeprefix("\n"), True
        end = self._buffer.find(_CLOSE_PARAMETER)
        if end == -1:
            keep = max(
                hold_partial(self._buffer, "\n" + _CLOSE_PARAMETER),
                hold_partial(self._buffer, _CLOSE_PARAMETER),
            )
            ready, self._buffer = (
                self._buffer[: len(self._buffer) - keep],
                self._buffer[len(self._buffer) - keep :],
            )
            self._value_text(ready, events)
            return False
        self._value_text(self._buffer[:end].removesuffix("\n"), events)
        self._buffer = self._buffer[end + len(_CLOSE_PARAMETER) :]
        self._close_value(events)
        return True

    def _value_text(self, text: str, events: list[OutputEvent]) -> None:
        if self._streams_text:
            self._emit(json.dumps(text, ensure_ascii=False)[1:-1], events)
        else:
            self._value.append(text)

    def _close_value(self, events: list[OutputEvent]) -> None:
        assert self._parameter is not None
        if self._streams_text:
            self._emit('"', events)
        else:
            value = _value("".join(self._value), self._properties.get(self._parameter))
            self._emit(compact_json(value), events)
        self._parameter = None

    def _emit(self, fragment: str, events: list[OutputEvent]) -> None:
        if fragment and self._index is not None:
            events.append(self._emitter.arguments(self._index, fragment))

    def finish(self) -> list[OutputEvent]:
        """Cut inside the call: the arguments so far, closed."""
        events: list[OutputEvent] = []
        if self.verdict is not Verdict.STREAMING:
            return events
        if self._parameter is not None:
            self._value_text(self._buffer, events)
            self._close_value(events)
        self._emit("}" if self._opened else "{}", events)
        return events


class Qwen3CoderParser(CallStreamParser):
    """XML-parameter calls inside ``<tool_call>`` tags."""

    def __init__(self, config: ParserConfig) -> None:
        super().__init__(config, tags=Tags(START, END, _body, scanner=XmlCallScanner), leading_json=False)


def call_grammar(tools: Sequence[ToolSpec], *, prefix: str, max_calls: int | None) -> GrammarSpec:
    """Calls with each property as a ``<parameter=…>`` block; JSON-typed values follow their schema."""
    rules = ['text-value ::= ( [^<] | "<" [^/] )*']
    schemas: list[tuple[str, dict[str, Any]]] = []
    for index, tool in enumerate(tools):
        properties: Mapping[str, Any] = tool.parameters.get("properties") or {}
        required = set(tool.parameters.get("required") or ())
        parts = []
        freeform = tool.input_grammar
        for number, (key, schema) in enumerate(properties.items()):
            written = None
            if freeform is not None and key == freeform.argument:
                written = input_rules(freeform, f"input-{index}", json_string=False)
            if written is not None:
                value = f"input-{index}"
                rules.append(written.rstrip("\n"))
            elif isinstance(schema, Mapping) and schema.get("type") == "string":
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
