"""Reading a server-sent event stream as its clients do: events split at blank lines, comments skipped."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs

__all__ = ["Event", "events", "named", "payloads"]

DONE = "[DONE]"


@attrs.frozen
class Event:
    """One event: its ``event:`` name (None without one) and its ``data:`` lines joined."""

    name: str | None
    data: str


Stream = bytes | str | Iterable[str]
"""A whole body, or its lines as ``httpx.Response.iter_lines()`` gives them (blank lines included)."""


def events(raw: Stream) -> list[Event]:
    """Every event of *raw*, in order; comment lines (``: keep-alive``) and empty frames skipped."""
    out = []
    for frame in _text(raw).split("\n\n"):
        name = None
        data: list[str] = []
        for line in frame.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
        if name is not None or data:
            out.append(Event(name=name, data="\n".join(data)))
    return out


def _text(raw: Stream) -> str:
    if isinstance(raw, bytes):
        return raw.decode()
    return raw if isinstance(raw, str) else "\n".join(raw)


def payloads(raw: Stream) -> list[Any]:
    """The JSON of every event's data but OpenAI's closing ``[DONE]``."""
    return [json.loads(event.data) for event in events(raw) if event.data != DONE]


def named(raw: Stream) -> list[tuple[str, Any]]:
    """``(name, JSON data)`` of every event (Anthropic's and the Responses API's streams name each)."""
    out = []
    for event in events(raw):
        assert event.name is not None, f"an unnamed event: {event.data[:80]}"
        out.append((event.name, json.loads(event.data)))
    return out
