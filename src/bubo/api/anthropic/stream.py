"""Anthropic streaming: the exact event sequence the official SDK expects.

``message_start``; per content block ``content_block_start``, its deltas
(``text_delta``, ``thinking_delta``, ``input_json_delta``) and
``content_block_stop``; ``message_delta`` with the stop reason and usage;
``message_stop``.  ``ping`` events keep the connection alive while a long
prompt is evaluated, and whenever nothing else was sent for a while (a request
waiting for its slot).  An error after the headers is an ``event: error``.

``message_start`` waits for the engine's first prompt-progress report, so its
usage already says how many prompt tokens came from the cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from bubo.api._json import dumps, unstructure
from bubo.api._sse import sse_frame
from bubo.domain.generation import GenerationStats, PromptProgress, StopCause
from bubo.domain.output import (
    Done,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.errors import BuboError

from . import wire
from .errors import error_envelope
from .translate import stop_reason, tool_use_id, usage

__all__ = ["MessageStream"]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return sse_frame(dumps({"type": name, **data}), event=name)


class MessageStream:
    """Encodes output events as Anthropic stream events."""

    def __init__(self, *, message_id: str, model: str, prompt_tokens: int, request_id: str) -> None:
        self._message_id = message_id
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._request_id = request_id
        self._started = False
        self._block: str | None = None  # "text", "thinking" or "tool_use"
        self._index = -1
        self._tool_index: int | None = None

    def opening(self) -> Iterable[bytes]:
        """Nothing yet: ``message_start`` waits for the prompt's cache report."""
        return ()

    def _start(self, cached_tokens: int) -> Iterator[bytes]:
        if self._started:
            return
        self._started = True
        stats = GenerationStats(prompt_tokens=self._prompt_tokens, cached_tokens=cached_tokens)
        start = wire.Message(
            id=self._message_id,
            model=self._model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=usage(stats, output_tokens=0),
        )
        yield _event("message_start", {"message": unstructure(start)})

    def _open_block(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        yield from self._close_block()
        self._index += 1
        self._block = kind
        yield _event("content_block_start", {"index": self._index, "content_block": block})

    def _close_block(self) -> Iterator[bytes]:
        if self._block is None:
            return
        if self._block == "thinking":
            yield self._delta({"type": "signature_delta", "signature": ""})
        yield _event("content_block_stop", {"index": self._index})
        self._block = None
        self._tool_index = None

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})

    def _progress(self, event: PromptProgress) -> Iterable[bytes]:
        """message_start with the first chunk of the prompt read, a ping with each later one."""
        if not event.processed:  # the report before any prompt token is decoded: nothing to show yet
            return
        if self._started:
            yield _event("ping", {})
        yield from self._start(event.cached)

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        """Frames for one output event."""
        if isinstance(event, PromptProgress):
            yield from self._progress(event)
            return
        yield from self._start(0)
        match event:
            case TextDelta(text=text) if text:
                if self._block != "text":
                    yield from self._open_block("text", {"type": "text", "text": ""})
                yield self._delta({"type": "text_delta", "text": text})
            case ReasoningDelta(text=text) if text:
                if self._block != "thinking":
                    yield from self._open_block(
                        "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                    )
                yield self._delta({"type": "thinking_delta", "thinking": text})
            case ToolCallStart(index=index, id=call_id, name=name):
                block = {"type": "tool_use", "id": tool_use_id(call_id), "name": name, "input": {}}
                yield from self._open_block("tool_use", block)
                self._tool_index = index
            case ToolCallArgumentsDelta(index=index, fragment=fragment) if index == self._tool_index:
                yield self._delta({"type": "input_json_delta", "partial_json": fragment})
            case Done():
                yield from self._finish(event)

    def _finish(self, done: Done) -> Iterator[bytes]:
        yield from self._close_block()
        stop_sequence = done.stop_word if done.cause is StopCause.STOP_WORD else None
        yield _event(
            "message_delta",
            {
                "delta": {"stop_reason": stop_reason(done), "stop_sequence": stop_sequence},
                "usage": unstructure(usage(done.stats)),
            },
        )
        yield _event("message_stop", {})

    def keepalive(self) -> Iterable[bytes]:
        """A ``ping`` event (the SDKs skip it, before ``message_start`` too)."""
        return [_event("ping", {})]

    def error(self, error: BuboError) -> Iterable[bytes]:
        """``event: error`` with the Anthropic envelope; the stream ends there."""
        envelope = unstructure(error_envelope(error, self._request_id))
        return [sse_frame(dumps(envelope), event="error")]
