"""Ollama's answers: a chunk per token, as NDJSON when streamed, folded into one object when not.

Streamed (the default): ``application/x-ndjson``, one JSON object per line,
each line sent as soon as its token is decoded.  Every chunk carries ``model``
(as the client spelled it), ``created_at`` and ``done``; chat chunks carry
``message.role`` and ``message.content`` (empty, never absent), with
``thinking`` and whole ``tool_calls`` (Ollama sends a call once it is
complete, its arguments an object).  The last line has ``done: true``,
``done_reason`` and the metrics; ``/api/generate``'s also ``context``.  An error
after the headers is a last ``{"error": "..."}`` line, with no ``done`` line.
A stream silent for ``--sse-keepalive`` seconds (waiting for the slot, reading
a long prompt) sends a keep-alive line: a ``done: false`` chunk with empty
content, which Ollama's clients read as a chunk that adds nothing (the Python
and JavaScript clients yield it and their callers, LangChain and Open WebUI
among them, join its empty text), so a client with a read timeout of its own
sees activity; none follows the ``done`` line.

Not streamed: the chunks are folded as Ollama folds them (texts joined, calls
and log-probabilities gathered, the rest from the last chunk).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import trio
from quart import Response

from bubo.api._context import api_context
from bubo.api._json import dumps, json_response, unstructure
from bubo.api._sse import EventStreamBody
from bubo.domain.messages import ToolCall
from bubo.domain.output import (
    Done,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.errors import BuboError, InternalError

from . import wire
from .translate import Clock, created_at, done_reason, logprobs, tool_call_out

__all__ = ["ChatChunks", "GenerateChunks", "NdjsonStream", "answer", "line", "ndjson_response"]

NDJSON = "application/x-ndjson"


def line(model: object) -> bytes:
    """One NDJSON line for a response model or a plain JSON value."""
    return (dumps(unstructure(model) if attrs.has(type(model)) else model) + "\n").encode()


class _Chunks:
    """What chat and generate chunks share: timing, log-probabilities, the calls being assembled."""

    def __init__(self, *, model: str, received: float, top_logprobs: bool) -> None:
        self.model = model
        self._received = received
        self._loaded = received
        self._top_logprobs = top_logprobs
        self._call: tuple[ToolCallStart, list[str]] | None = None
        self._calls = 0

    def started(self) -> None:
        """The generation has its slot: the model is "loaded" for this request."""
        self._loaded = trio.current_time()

    def metrics(self, done: Done) -> dict[str, int]:
        return Clock(received=self._received, loaded=self._loaded).metrics(done.stats, trio.current_time())

    def logprobs(self, event: TextDelta) -> list[wire.Logprob] | None:
        return logprobs(event.logprobs, self._top_logprobs) if event.logprobs else None

    def open_call(self, event: ToolCallStart) -> ToolCall | None:
        finished = self.close_call()
        self._call = (event, [])
        return finished

    def add_arguments(self, event: ToolCallArgumentsDelta) -> None:
        if self._call is not None and self._call[0].index == event.index:
            self._call[1].append(event.fragment)

    def close_call(self) -> ToolCall | None:
        """The call being assembled, now complete (None when there is none)."""
        if self._call is None:
            return None
        start, fragments = self._call
        self._call = None
        return ToolCall(id=start.id, name=start.name, arguments="".join(fragments))

    def call_out(self, call: ToolCall) -> wire.ToolCallOut:
        out = tool_call_out(call, self._calls)
        self._calls += 1
        return out


class ChatChunks(_Chunks):
    """Output events as ``/api/chat`` chunks."""

    def _chunk(self, message: wire.MessageOut, **fields: Any) -> wire.ChatResponse:
        return wire.ChatResponse(model=self.model, created_at=created_at(), message=message, **fields)

    def _call_chunk(self, call: ToolCall | None) -> list[wire.ChatResponse]:
        if call is None:
            return []
        return [self._chunk(wire.MessageOut(tool_calls=[self.call_out(call)]), done=False)]

    def feed(self, event: OutputEvent) -> list[wire.ChatResponse]:
        """The chunks one output event makes (none while a call is still being assembled)."""
        match event:
            case TextDelta(text=text):
                found = self.logprobs(event)
                if not text and found is None:
                    return []
                chunks = self._call_chunk(self.close_call())
                return [*chunks, self._chunk(wire.MessageOut(content=text), done=False, logprobs=found)]
            case ReasoningDelta(text=text) if text:
                chunks = self._call_chunk(self.close_call())
                return [*chunks, self._chunk(wire.MessageOut(thinking=text), done=False)]
            case ToolCallStart():
                return self._call_chunk(self.open_call(event))
            case ToolCallArgumentsDelta():
                self.add_arguments(event)
            case Done():
                chunks = self._call_chunk(self.close_call())
                final = self._chunk(
                    wire.MessageOut(), done=True, done_reason=done_reason(event), **self.metrics(event)
                )
                return [*chunks, final]
        return []

    def idle(self) -> wire.ChatResponse:
        """A chunk that adds nothing: the keep-alive."""
        return self._chunk(wire.MessageOut(), done=False)

    @staticmethod
    def fold(chunks: Sequence[wire.ChatResponse]) -> wire.ChatResponse:
        """One answer from its chunks, as Ollama folds them."""
        last = chunks[-1]
        thinking = "".join(c.message.thinking or "" for c in chunks)
        calls = [call for c in chunks for call in c.message.tool_calls or ()]
        found = [entry for c in chunks for entry in c.logprobs or ()]
        message = wire.MessageOut(
            content="".join(c.message.content for c in chunks),
            thinking=thinking or None,
            tool_calls=calls or None,
        )
        return attrs.evolve(last, message=message, logprobs=found or None)


class GenerateChunks(_Chunks):
    """Output events as ``/api/generate`` chunks; *prompt_tokens* start the final ``context``."""

    def __init__(
        self, *, model: str, received: float, top_logprobs: bool, prompt_tokens: Sequence[int] | None
    ) -> None:
        super().__init__(model=model, received=received, top_logprobs=top_logprobs)
        self._context = None if prompt_tokens is None else list(prompt_tokens)

    def _chunk(self, response: str, **fields: Any) -> wire.GenerateResponse:
        return wire.GenerateResponse(model=self.model, created_at=created_at(), response=response, **fields)

    def _note(self, token_ids: Sequence[int]) -> None:
        if self._context is not None:
            self._context.extend(token_ids)

    def feed(self, event: OutputEvent) -> list[wire.GenerateResponse]:
        """The chunks one output event makes."""
        match event:
            case TextDelta(text=text, token_ids=token_ids):
                self._note(token_ids)
                found = self.logprobs(event)
                if text or found is not None:
                    return [self._chunk(text, done=False, logprobs=found)]
            case ReasoningDelta(text=text, token_ids=token_ids):
                self._note(token_ids)
                if text:
                    return [self._chunk("", thinking=text, done=False)]
            case Done():
                return [
                    self._chunk(
                        "",
                        done=True,
                        done_reason=done_reason(event),
                        context=self._context,
                        **self.metrics(event),
                    )
                ]
        return []

    def idle(self) -> wire.GenerateResponse:
        """A chunk that adds nothing: the keep-alive."""
        return self._chunk("", done=False)

    @staticmethod
    def fold(chunks: Sequence[wire.GenerateResponse]) -> wire.GenerateResponse:
        """One answer from its chunks, as Ollama folds them."""
        thinking = "".join(c.thinking or "" for c in chunks)
        found = [entry for c in chunks for entry in c.logprobs or ()]
        return attrs.evolve(
            chunks[-1],
            response="".join(c.response for c in chunks),
            thinking=thinking or None,
            logprobs=found or None,
        )


Chunks = ChatChunks | GenerateChunks


class NdjsonStream:
    """The :class:`~bubo.api._sse.StreamEncoder` of Ollama's streams: each chunk as one line."""

    def __init__(self, chunks: Chunks) -> None:
        self._chunks = chunks

    def opening(self) -> Iterable[bytes]:
        """Nothing: the first token opens the stream (the slot is held from now on)."""
        self._chunks.started()
        return ()

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        """The lines of one output event."""
        return [line(chunk) for chunk in self._chunks.feed(event)]

    def error(self, error: BuboError) -> Iterable[bytes]:
        """``{"error": "..."}``: the stream ends there, without a ``done`` line."""
        return [line(wire.ErrorBody(error=error.message))]

    def keepalive(self) -> Iterable[bytes]:
        """A ``done: false`` chunk with empty content (``EventStreamBody`` sends none after the end)."""
        return [line(self._chunks.idle())]


Output = AbstractAsyncContextManager[AsyncIterator[OutputEvent]]


def ndjson_response(output: Output, chunks: Chunks) -> Response:
    """A streamed answer: one line per chunk, never cut by Quart's response timeout."""
    response = Response(
        EventStreamBody(output, NdjsonStream(chunks), keepalive_s=api_context().sse_keepalive_s),
        status=200,
        content_type=NDJSON,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.timeout = None
    return response


async def answer(output: Output, chunks: Chunks) -> Response:
    """A whole answer: the generation run to its end, its chunks folded into one JSON object."""
    async with output as events:
        chunks.started()
        made: list[Any] = []
        async for event in events:
            made.extend(chunks.feed(event))
    if not made or not made[-1].done:
        raise InternalError("the generation ended without a result")
    return json_response(chunks.fold(made))
