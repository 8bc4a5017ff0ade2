"""The streaming machine every tool-call format shares.

Text passes through at once, except the bytes that could still begin a call:
a partial opening tag (``<tool_``), or, for formats that allow it, a JSON
object, array or ```` ``` ```` fence as the very first thing in the output
(small coder models answer with a bare call) until its first key shows whether
it is a call.  A call starts as soon as its name is known and its arguments
stream as they are generated (each format's scanner reads its body: JSON in
:mod:`._json_calls`, XML parameters in :mod:`.qwen3_coder`).  A body of
another shape is held until complete and read by the format's whole-body
parser; one that does not parse is released as text (and logged at debug).
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable
from typing import Protocol

from bubo.domain.output import OutputEvent, TextDelta
from bubo.parsers.base import ParserConfig, hold_partial

from ._calls import Emitter, ParsedCall, calls_from_json, joined_fragments
from ._json_calls import JsonCallScanner, Verdict

__all__ = ["BodyScanner", "CallStreamParser", "Tags", "Verdict", "json_scanner"]

logger = logging.getLogger(__name__)

BodyParser = Callable[[str, ParserConfig], list[ParsedCall] | None]


class BodyScanner(Protocol):
    """Reads one call body as it is written (see :class:`Verdict`)."""

    verdict: Verdict
    held: str  # the text read while undecided (the body's text, once NOT_A_CALL or WHOLE)
    rest: str  # the text after the point of a NOT_A_CALL, WHOLE or DONE verdict, unread

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume text; the events of the calls it started and their arguments."""
        ...

    def finish(self) -> list[OutputEvent]:
        """The output ended inside the body."""
        ...


ScannerFactory = Callable[[ParserConfig, Emitter], BodyScanner]


def json_scanner(config: ParserConfig, emitter: Emitter) -> BodyScanner:
    """A JSON body inside tags: any name is a call (the tags say so), an array holds several."""
    return JsonCallScanner(config, emitter, known_only=False, array=True)


class Tags:
    """A format's opening and closing markers and how to read what is between them.

    *scanner* reads a body as it is written; *body* reads a whole one (a body
    of a shape the scanner does not stream).  With ``json_body`` the closing
    marker is looked for only after the JSON value that opens the body, so an
    argument may contain it.
    """

    def __init__(
        self, start: str, end: str, body: BodyParser, *, scanner: ScannerFactory, json_body: bool = False
    ) -> None:
        self.start = start
        self.end = end
        self.body = body
        self.scanner = scanner
        self.json_body = json_body


class _Mode(enum.Enum):
    LEAD = "lead"  # only whitespace so far
    TEXT = "text"
    TAGGED = "tagged"  # inside start…end, the scanner reading the body
    TAGGED_WHOLE = "tagged_whole"  # inside start…end, a body to read whole
    AFTER_TAGGED = "after_tagged"  # a body read: up to the end marker
    JSON = "json"  # a leading bare or fenced JSON call, the scanner reading it
    JSON_WHOLE = "json_whole"  # a leading JSON value to read whole
    AFTER_JSON = "after_json"  # a leading call read: its closing fence, if any


_FENCE = "```"


class CallStreamParser:
    """Finds tool calls in streamed text for one format."""

    def __init__(self, config: ParserConfig, *, tags: Tags | None, leading_json: bool) -> None:
        self._config = config
        self._tags = tags
        self._leading_json = leading_json
        self._mode = _Mode.LEAD
        self._held = ""
        self._emitter = Emitter(config)
        self._scanner: BodyScanner | None = None
        self._opening = ""  # a leading call's text before its JSON: whitespace, the fence line
        self._fenced = False
        self._after_call = False  # whitespace right after a call is not answer text
        self._readers: dict[_Mode, Callable[[str, list[OutputEvent]], str]] = {
            _Mode.LEAD: self._lead,
            _Mode.TEXT: self._text,
            _Mode.TAGGED: self._scan_tagged,
            _Mode.TAGGED_WHOLE: self._tagged_whole,
            _Mode.AFTER_TAGGED: self._after_tagged,
            _Mode.JSON: self._scan_json,
            _Mode.JSON_WHOLE: self._json_whole,
            _Mode.AFTER_JSON: self._after_json,
        }

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume text; return text deltas and the calls' events as they become known."""
        events: list[OutputEvent] = []
        pending = self._held + text
        self._held = ""
        while pending:
            pending = self._step(pending, events)
        return joined_fragments(events)

    def _step(self, pending: str, events: list[OutputEvent]) -> str:
        """Read *pending* in the current mode; what is left for the next mode."""
        return self._readers[self._mode](pending, events)

    # ---- text --------------------------------------------------------------------------------------

    def _lead(self, pending: str, _events: list[OutputEvent]) -> str:
        stripped = pending.lstrip()
        if not stripped:
            self._held = pending
            return ""
        if self._leading_json and stripped[0] in "{[`":
            self._mode = _Mode.JSON
            self._opening = pending[: len(pending) - len(stripped)]
            self._fenced = stripped[0] == "`"
            return stripped
        self._mode = _Mode.TEXT
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
            self._scanner = self._tags.scanner(self._config, self._emitter)
            return pending[index + len(self._tags.start) :]
        keep = hold_partial(pending, self._tags.start)
        if len(pending) > keep:
            events.append(TextDelta(text=pending[: len(pending) - keep]))
        self._held = pending[len(pending) - keep :]
        return ""

    # ---- a tagged call -----------------------------------------------------------------------------

    def _scan_tagged(self, pending: str, events: list[OutputEvent]) -> str:
        scanner = self._scanner
        assert scanner is not None
        events.extend(scanner.feed(pending))
        if scanner.verdict in (Verdict.NOT_A_CALL, Verdict.WHOLE):
            self._mode = _Mode.TAGGED_WHOLE
            return scanner.held + scanner.rest
        if scanner.verdict is Verdict.DONE:
            self._mode = _Mode.AFTER_TAGGED
            return scanner.rest
        return ""

    def _after_tagged(self, pending: str, _events: list[OutputEvent]) -> str:
        """Up to the end marker after a streamed body: another body, or anything else, which is dropped."""
        assert self._tags is not None
        stripped = pending.lstrip()
        if stripped[:1] == "{":
            self._mode = _Mode.TAGGED  # a second call in the same block
            self._scanner = self._tags.scanner(self._config, self._emitter)
            return stripped
        index = pending.find(self._tags.end)
        if index != -1:
            if pending[:index].strip():
                logger.debug("dropped text after a tool call's body: %r", pending[:index][:80])
            self._mode, self._after_call = _Mode.TEXT, True
            return pending[index + len(self._tags.end) :]
        self._held = pending
        return ""

    def _tagged_whole(self, pending: str, events: list[OutputEvent]) -> str:
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

    # ---- a leading bare or fenced call ---------------------------------------------------------------

    def _scan_json(self, pending: str, events: list[OutputEvent]) -> str:
        if self._scanner is None:
            if self._fenced:
                pending = self._fence_line(pending)
                if self._mode is not _Mode.JSON or (not pending and self._held):
                    return pending
            self._scanner = JsonCallScanner(self._config, self._emitter, known_only=True, array=True)
        scanner = self._scanner
        events.extend(scanner.feed(pending))
        if scanner.verdict is Verdict.NOT_A_CALL:
            self._mode = _Mode.TEXT
            events.append(TextDelta(text=self._opening + scanner.held))
            return scanner.rest
        if scanner.verdict is Verdict.WHOLE:
            self._mode = _Mode.JSON_WHOLE
            return self._opening + scanner.held + scanner.rest
        if scanner.verdict is Verdict.DONE:
            self._mode = _Mode.AFTER_JSON
            return scanner.rest
        return ""

    def _fence_line(self, pending: str) -> str:
        """Take the fence's first line (```` ```json ````) into the opening; what follows it, if JSON may."""
        newline = pending.find("\n")
        if newline == -1:
            if not pending.startswith(_FENCE) and not _FENCE.startswith(pending):
                self._mode = _Mode.TEXT  # a backtick, but no fence
                return self._release_opening(pending)
            self._held = pending
            return ""
        line = pending[: newline + 1]
        if not line.startswith(_FENCE) or line[3:].strip().lower() not in ("", "json"):
            self._mode = _Mode.TEXT  # a fence of something else: text
            return self._release_opening(pending)
        self._opening += line
        return pending[newline + 1 :]

    def _release_opening(self, pending: str) -> str:
        opening, self._opening = self._opening, ""
        return opening + pending

    def _after_json(self, pending: str, _events: list[OutputEvent]) -> str:
        """After a leading call: its closing fence (if fenced), then text."""
        if self._fenced:
            stripped = pending.lstrip()
            if not stripped or (len(stripped) < len(_FENCE) and _FENCE.startswith(stripped)):
                self._held = pending
                return ""
            if stripped.startswith(_FENCE):
                pending = stripped[len(_FENCE) :]
        self._mode, self._after_call = _Mode.TEXT, True
        return pending

    def _json_whole(self, pending: str, events: list[OutputEvent]) -> str:
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

    # ---- the end -----------------------------------------------------------------------------------

    def finish(self) -> list[OutputEvent]:
        """Flush: a call being streamed ends where it was cut; one held whole is parsed if it can be."""
        held, self._held = self._held, ""
        events: list[OutputEvent] = []
        match self._mode:
            case _Mode.TAGGED | _Mode.JSON if self._scanner is not None and self._scanner.verdict in (
                Verdict.STREAMING,
                Verdict.DONE,
            ):
                events.extend(self._scanner.finish())
            case _Mode.TAGGED:
                assert self._scanner is not None
                self._finish_tagged(self._scanner.held + held, events)
            case _Mode.TAGGED_WHOLE:
                self._finish_tagged(held, events)
            case _Mode.JSON:
                undecided = self._scanner.held if self._scanner is not None else ""
                self._finish_json(self._opening + undecided + held, events)
            case _Mode.JSON_WHOLE:
                self._finish_json(held, events)
            case _Mode.TEXT if held:
                events.append(TextDelta(text=held))
            case _Mode.LEAD if held.strip():
                events.append(TextDelta(text=held))
        return joined_fragments(events)

    def _finish_tagged(self, body: str, events: list[OutputEvent]) -> None:
        assert self._tags is not None
        calls = self._tags.body(body, self._config)
        if calls is None:
            events.append(TextDelta(text=self._tags.start + body))
        else:
            events.extend(self._emitter.emit(calls))

    def _finish_json(self, text: str, events: list[OutputEvent]) -> None:
        value = _decode_whole(text)
        calls = None if value is _NOT_JSON else calls_from_json(value, self._config, known_only=True)
        events.extend(self._emitter.emit(calls) if calls else [TextDelta(text=text)] if text else [])


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
