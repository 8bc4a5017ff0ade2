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

Each character is read about once whatever the output's length: held bodies
are read piece by piece (:mod:`._held`), held white space is kept aside rather
than searched again, and a fence's first line is at most
:data:`MAX_FENCE_LINE` characters.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Protocol

from bubo.domain.output import OutputEvent, TextDelta
from bubo.parsers.base import ParserConfig, hold_partial

from ._calls import Emitter, ParsedCall, calls_from_json, joined_fragments
from ._held import NOT_JSON, LeadingBody, TaggedBody, decode_whole
from ._json_calls import JsonCallScanner, Verdict

__all__ = ["MAX_FENCE_LINE", "BodyScanner", "CallStreamParser", "Tags", "Verdict", "json_scanner"]

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
MAX_FENCE_LINE = 64
"""The longest first line of a leading fence (```` ```json ````) waited for; a longer one is text."""


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
        self._space: list[str] = []  # the output's leading white space, while nothing else came
        self._dropping = False  # text after a streamed body, before its end marker, is being dropped
        self._tagged_body: TaggedBody | None = None  # a tagged body read whole
        self._leading_body: LeadingBody | None = None  # a leading body read whole
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
            self._space.append(pending)
            return ""
        pending, self._space = "".join(self._space) + pending, []
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
            assert self._tags is not None
            self._mode = _Mode.TAGGED_WHOLE
            self._tagged_body = TaggedBody(self._tags.end, json_body=self._tags.json_body)
            return scanner.held + scanner.rest
        if scanner.verdict is Verdict.DONE:
            self._mode = _Mode.AFTER_TAGGED
            return scanner.rest
        return ""

    def _after_tagged(self, pending: str, _events: list[OutputEvent]) -> str:
        """Up to the end marker after a streamed body: another body, or anything else, which is dropped.

        Only a partial end marker is held: white space and dropped text are not read again.
        """
        assert self._tags is not None
        stripped = pending.lstrip()
        if stripped[:1] == "{" and not self._dropping:
            self._mode = _Mode.TAGGED  # a second call in the same block
            self._scanner = self._tags.scanner(self._config, self._emitter)
            return stripped
        index = pending.find(self._tags.end)
        if index == -1:
            keep = hold_partial(pending, self._tags.end)
            dropped, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        else:
            dropped = pending[:index]
        if dropped.strip() and not self._dropping:
            logger.debug("dropped text after a tool call's body: %r", dropped.strip()[:80])
            self._dropping = True
        if index == -1:
            return ""
        self._mode, self._after_call, self._dropping = _Mode.TEXT, True, False
        return pending[index + len(self._tags.end) :]

    def _tagged_whole(self, pending: str, events: list[OutputEvent]) -> str:
        assert self._tags is not None
        assert self._tagged_body is not None
        index = self._tagged_body.feed(pending)
        if index == -1:
            return ""
        body, self._tagged_body = self._tagged_body.text, None
        self._close_tagged(body[:index], events)
        self._mode = _Mode.TEXT
        return body[index + len(self._tags.end) :]

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
            self._leading_body = LeadingBody()
            return self._opening + scanner.held + scanner.rest
        if scanner.verdict is Verdict.DONE:
            self._mode = _Mode.AFTER_JSON
            return scanner.rest
        return ""

    def _fence_line(self, pending: str) -> str:
        """Take the fence's first line (```` ```json ````) into the opening; what follows it, if JSON may."""
        newline = pending.find("\n")
        if newline == -1:
            if (not pending.startswith(_FENCE) and not _FENCE.startswith(pending)) or len(
                pending
            ) > MAX_FENCE_LINE:
                self._mode = _Mode.TEXT  # a backtick, but no fence (or a line no fence of JSON has)
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
                self._held = stripped  # white space before the closing fence is dropped either way
                return ""
            if stripped.startswith(_FENCE):
                pending = stripped[len(_FENCE) :]
        self._mode, self._after_call = _Mode.TEXT, True
        return pending

    def _json_whole(self, pending: str, events: list[OutputEvent]) -> str:
        assert self._leading_body is not None
        outcome = self._leading_body.feed(pending)
        if outcome is None:  # incomplete: wait for more
            return ""
        value, end = outcome
        text, self._leading_body = self._leading_body.text, None
        calls = None if value is NOT_JSON else calls_from_json(value, self._config, known_only=True)
        self._mode = _Mode.TEXT
        if calls is None:
            events.append(TextDelta(text=text[:end]))
        else:
            events.extend(self._emitter.emit(calls))
            self._after_call = True
        return text[end:]

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
                assert self._tagged_body is not None
                self._finish_tagged(self._tagged_body.text, events)
            case _Mode.JSON:
                undecided = self._scanner.held if self._scanner is not None else ""
                self._finish_json(self._opening + undecided + held, events)
            case _Mode.JSON_WHOLE:
                assert self._leading_body is not None
                self._finish_json(self._leading_body.text, events)
            case _Mode.TEXT if held:
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
        value = decode_whole(text)
        calls = None if value is NOT_JSON else calls_from_json(value, self._config, known_only=True)
        events.extend(self._emitter.emit(calls) if calls else [TextDelta(text=text)] if text else [])
