"""Turning parsed JSON into tool calls, and calls into output events."""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs

from bubo.domain.output import OutputEvent, ToolCallArgumentsDelta, ToolCallStart
from bubo.parsers.base import ParserConfig

__all__ = ["Emitter", "ParsedCall", "calls_from_json", "compact_json", "joined_fragments"]

logger = logging.getLogger(__name__)


@attrs.frozen
class ParsedCall:
    """A complete call: a function name and its arguments as JSON text."""

    name: str
    arguments: str


def compact_json(value: Any) -> str:
    """JSON text without spaces, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def calls_from_json(value: Any, config: ParserConfig, *, known_only: bool) -> list[ParsedCall] | None:
    """``{"name", "arguments"}`` objects (or a list of them) as calls, else ``None``.

    ``parameters`` is accepted for ``arguments``, and arguments given as a JSON
    string are decoded.  With *known_only*, a name the request did not offer
    means "not a tool call" (bare JSON may just be an answer).
    """
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return None
        name = item.get("name")
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        if known_only and config.tool(name) is None:
            return None
        calls.append(ParsedCall(name=name, arguments=compact_json(arguments)))
    return calls or None


class Emitter:
    """Numbers calls, enforces ``max_calls``, and makes their events."""

    def __init__(self, config: ParserConfig) -> None:
        self._config = config
        self.count = 0

    def start(self, name: str, events: list[OutputEvent]) -> int | None:
        """Add a call's start to *events*; its index, or ``None`` (nothing added) past ``max_calls``."""
        if self._config.max_calls is not None and self.count >= self._config.max_calls:
            logger.debug("dropping tool call %r: only %d call(s) allowed", name, self._config.max_calls)
            return None
        index = self.count
        self.count += 1
        events.append(ToolCallStart(index=index, id=self._config.new_id(), name=name))
        return index

    @staticmethod
    def arguments(index: int, fragment: str) -> ToolCallArgumentsDelta:
        """A fragment of call *index*'s arguments."""
        return ToolCallArgumentsDelta(index=index, fragment=fragment)

    def emit(self, calls: list[ParsedCall]) -> list[OutputEvent]:
        """Start and argument events for each whole call still allowed."""
        events: list[OutputEvent] = []
        for call in calls:
            index = self.start(call.name, events)
            if index is not None:
                events.append(self.arguments(index, call.arguments))
        return events


def joined_fragments(events: list[OutputEvent]) -> list[OutputEvent]:
    """*events* with adjacent argument fragments of one call joined (scanners make one per character)."""
    out: list[OutputEvent] = []
    for event in events:
        last = out[-1] if out else None
        if (
            isinstance(event, ToolCallArgumentsDelta)
            and isinstance(last, ToolCallArgumentsDelta)
            and last.index == event.index
        ):
            out[-1] = ToolCallArgumentsDelta(index=event.index, fragment=last.fragment + event.fragment)
        else:
            out.append(event)
    return out
