"""The streaming machine every tool-call format shares.

Text passes through until a call begins: an opening tag (``<tool_call>``), or,
for formats that allow it, a JSON object, array or ```` ``` ```` fence as the
very first thing in the output (small coder models answer with a bare call).
A call's text is held until it is complete, then parsed by the format's body
parser; a call that does not parse is released as text (and logged at debug).
Partial opening tags are held back, never leaked into the text.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable

from bubo.domain.output import OutputEvent, TextDelta
from bubo.parsers.base import ParserConfig, hold_partial

from ._calls import Emitter, ParsedCall, calls_from_json

__all__ = ["CallStreamParser", "Tags"]

logger = logging.getLogger(__name__)

BodyParser = Callable[[str, ParserConfig], list[ParsedCall] | None]


class Tags:
    """A format's opening and closing markers and how to read what is between them.

    With ``json_body`` the closing marker is looked for only after the JSON
    value that opens the body, so an argument may contain it.
    """

    def __init__(self, start: str, end: str, body: BodyParser, *, json_body: bool = False) -> None:
        self.start = start
        self.end = end
        self.body = body
        self.json_body = json_body


class _Mode(enum.Enum):
    LEAD = "lead"  # only whitespace so far
    TEXT = "text"
    TAGGED = "tagged"  # inside start…end
    JSON = "json"  # a leading bare or fenced JSON candidate


class CallStreamParser:
    """Finds tool calls in streamed text for one format."""

    def __init__(self, config: ParserConfig, *, tags: Tags | None, leading_json: bool) -> None:
        self._config = config
        self._tags = tags
        self._leading_json = leading_json
        self._mode = _Mode.LEAD
        self._held = ""
        self._emitter = Emitter(config)
        self._after_call = False  # whitespace right after a call is not answer text

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume text; return text deltas and completed calls."""
        events: list[OutputEvent] = []
        pending = self._held + text
        self._held = ""
        while pending:
            pending = self._step(pending, events)
        return events

    def _step(self, pending: str, events: list[OutputEvent]) -> str:
        match self._mode:
            case _Mode.LEAD:
                return self._lead(pending)
            case _Mode.TEXT:
                return self._text(pending, events)
            case _Mode.TAGGED:
                return self._tagged(pending, events)
            case _Mode.JSON:
                return self._json(pending, events)

    def _lead(self, pending: str) -> str:
        stripped = pending.lstrip()
        if not stripped:
            self._held = pending
            return ""
        self._mode = _Mode.JSON if self._leading_json and stripped[0] in "{[`" else _Mode.TEXT
        return pending

    def _text(self, pending: str, events: list[OutputEvent]) -> str:
        if self._after_call:
            pending = pending.lstrip()
            if not pending:
                return ""
            self._after_call = False
        if self._tags is None:
            events.append(TextDelta(text=pending))
            return ""
        index = pending.find(self._tags.start)
        if index != -1:
            if index:
                events.append(TextDelta(text=pending[:index]))
            self._mode = _Mode.TAGGED
            return pending[index + len(self._tags.start) :]
        keep = hold_partial(pending, self._tags.start)
        if len(pending) > keep:
            events.append(TextDelta(text=pending[: len(pending) - keep]))
        self._held = pending[len(pending) - keep :]
        return ""

    def _tagged(self, pending: str, events: list[OutputEvent]) -> str:
        assert self._tags is not None
        index = self._end_of_body(pending)
        if index == -1:
            self._held = pending
            return ""
        self._close_tagged(pending[:index], events)
        self._mode = _Mode.TEXT
        return pending[index + len(self._tags.end) :]

    def _end_of_body(self, pending: str) -> int:
        """Where the closing marker starts, or -1 while the body may go on."""
        assert self._tags is not None
        stripped = pending.lstrip()
        if self._tags.json_body and stripped[:1] in ("{", "["):
            try:
                _, end = _DECODER.raw_decode(stripped)
            except json.JSONDecodeError as error:
                if error.pos >= len(stripped) or error.msg.startswith("Unterminated string"):
                    return -1  # the JSON is still being written
            else:
                return pending.find(self._tags.end, len(pending) - len(stripped) + end)
        return pending.find(self._tags.end)

    def _close_tagged(self, body: str, events: list[OutputEvent]) -> None:
        assert self._tags is not None
        calls = self._tags.body(body, self._config)
        self._after_call = calls is not None
        if calls is None:
            logger.debug(
                "a %s…%s block did not parse as a tool call; kept as text", self._tags.start, self._tags.end
            )
            events.append(TextDelta(text=self._tags.start + body + self._tags.end))
        else:
            events.extend(self._emitter.emit(calls))

    def _json(self, pending: str, events: list[OutputEvent]) -> str:
        outcome = _leading_json(pending)
        if outcome is None:  # incomplete: wait for more
            self._held = pending
            return ""
        value, end = outcome
        calls = None if value is _NOT_JSON else calls_from_json(value, self._config, known_only=True)
        self._mode = _Mode.TEXT
        if calls is None:
            events.append(TextDelta(text=pending[:end]))
        else:
            events.extend(self._emitter.emit(calls))
            self._after_call = True
        return pending[end:]

    def finish(self) -> list[OutputEvent]:
        """Flush: an unclosed call is parsed if it can be, else released as text."""
        held, self._held = self._held, ""
        events: list[OutputEvent] = []
        if self._mode is _Mode.TAGGED:
            assert self._tags is not None
            calls = self._tags.body(held, self._config)
            if calls is None:
                events.append(TextDelta(text=self._tags.start + held))
            else:
                events.extend(self._emitter.emit(calls))
        elif self._mode is _Mode.JSON:
            value = _decode_whole(held)
            calls = None if value is _NOT_JSON else calls_from_json(value, self._config, known_only=True)
            events.extend(self._emitter.emit(calls) if calls else [TextDelta(text=held)])
        elif held and (self._mode is _Mode.TEXT or held.strip()):
            events.append(TextDelta(text=held))
        return events


_NOT_JSON = object()
_DECODER = json.JSONDecoder()


def _leading_json(text: str) -> tuple[object, int] | None:
    """A leading JSON value or fenced block.

    ``(value, end)``; ``(_NOT_JSON, end)`` when it is not JSON; ``None`` while incomplete.
    """
    stripped = text.lstrip()
    offset = len(text) - len(stripped)
    if stripped.startswith("`"):
        return _fenced(stripped, offset)
    try:
        value, end = _DECODER.raw_decode(stripped)
    except json.JSONDecodeError as error:
        incomplete = error.pos >= len(stripped) or error.msg.startswith("Unterminated string")
        return None if incomplete else (_NOT_JSON, len(text))
    return value, offset + end


def _fenced(text: str, offset: int) -> tuple[object, int] | None:
    if not text.startswith("```"):
        return None if "```".startswith(text) else (_NOT_JSON, offset + len(text))
    newline = text.find("\n")
    if newline == -1:
        return None
    language = text[3:newline].strip().lower()
    if language not in ("", "json"):
        return (_NOT_JSON, offset + len(text))
    close = text.find("```", newline + 1)
    if close == -1:
        return None
    return _decode_whole(text[newline + 1 : close]), offset + close + 3


def _decode_whole(text: str) -> object:
    stripped = text.strip()
    if stripped.startswith("```"):
        outcome = _fenced(stripped, 0)
        return _NOT_JSON if outcome is None else outcome[0]
    try:
        return json.loads(stripped)
    except ValueError:
        return _NOT_JSON
