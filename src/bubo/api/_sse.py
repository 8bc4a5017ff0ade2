"""Server-sent events: frame encoding and a Quart response body that owns a generation.

:class:`EventStreamBody` follows Quart's ``ResponseBody`` contract
(``async with body as frames: async for frame in frames``).  ``__aenter__``
opens a nursery whose one task enters the generation (waiting for the slot),
encodes its output events and hands the frames over an unbuffered channel;
iteration receives them, and whenever nothing came for the keep-alive
interval it sends the dialect's keep-alive instead (a queued request, or a
prompt read for minutes on a CPU, never trips a client's idle timeout).  Once
the last event (``Done``, or an error) is encoded, no keep-alive follows its
frames: a stream's end is its last frame in every dialect, however long the
slot takes to be released after it.
``__aexit__`` cancels that task (its own scope, not the reader's), which
cancels the decode if the client left (quart-trio cancels the request's
nursery on ``http.disconnect``).  No generator here holds a nursery or cancel
scope across a ``yield``.

Errors after the headers are sent cannot change the status any more; each
dialect's encoder turns them into its own in-stream error event.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Protocol

import trio
from quart import Response
from quart.wrappers.response import ResponseBody

from bubo.domain.output import Done, OutputEvent
from bubo.engine import EngineError
from bubo.errors import BuboError, InternalError

from ._context import api_context
from ._errors import engine_error

__all__ = [
    "COMMENT_KEEPALIVE",
    "KEEPALIVE_S",
    "EventStreamBody",
    "StreamEncoder",
    "sse_frame",
    "sse_response",
]

logger = logging.getLogger(__name__)

KEEPALIVE_S = 5.0
"""How long a stream may send nothing before a keep-alive (``--sse-keepalive`` sets the app's)."""

COMMENT_KEEPALIVE = b": keep-alive\n\n"
"""An SSE comment line: every SSE client skips it (chat, completions, ``/completion``)."""


def sse_frame(data: str, event: str | None = None) -> bytes:
    """One server-sent event; *data* must not contain newlines (compact JSON does not)."""
    if event is None:
        return f"data: {data}\n\n".encode()
    return f"event: {event}\ndata: {data}\n\n".encode()


class StreamEncoder(Protocol):
    """One dialect's event stream shape."""

    def opening(self) -> Iterable[bytes]:
        """Frames sent once the generation has the slot, before any output."""
        ...

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        """Frames for one output event (the ``Done`` event ends the stream)."""
        ...

    def error(self, error: BuboError) -> Iterable[bytes]:
        """Frames that report an error after the headers were sent."""
        ...

    def keepalive(self) -> Iterable[bytes]:
        """Frames that say "still working" while nothing else is sent."""
        ...


Output = AbstractAsyncContextManager[AsyncIterator[OutputEvent]]


class EventStreamBody(ResponseBody):
    """A response body that runs one generation and streams it as SSE, with keep-alives.

    *output* was admitted by the handler (so a full queue is still a plain
    503); entering it waits for the slot, after the headers went out, so an
    error from then on is reported in the stream.
    """

    def __init__(self, output: Output, encoder: StreamEncoder, *, keepalive_s: float = KEEPALIVE_S) -> None:
        self._output = output
        self._encoder = encoder
        self._keepalive_s = keepalive_s if keepalive_s > 0 else math.inf
        self._stack = AsyncExitStack()
        self._producer: trio.CancelScope | None = None  # the producer task's own scope
        self._frames: AsyncIterator[bytes] | None = None
        self._ended = False  # the last event (Done, or an error) was encoded: no keep-alive follows it

    async def __aenter__(self) -> AsyncIterator[bytes]:
        nursery = await self._stack.enter_async_context(trio.open_nursery())
        send, receive = trio.open_memory_channel[bytes](0)
        self._producer = await nursery.start(self._produce, send)
        self._frames = self._relay(receive)
        return self._frames

    async def _produce(
        self, send: trio.MemorySendChannel[bytes], task_status: trio.TaskStatus[trio.CancelScope]
    ) -> None:
        """Enter the generation, encode its events and send the frames; errors become error frames."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await self._send_frames(send)

    async def _send_frames(self, send: trio.MemorySendChannel[bytes]) -> None:
        encoder = self._encoder
        async with send:
            try:
                async with self._output as output:
                    for frame in encoder.opening():
                        await send.send(frame)
                    async for event in output:
                        self._ended = self._ended or isinstance(event, Done)
                        for frame in encoder.encode(event):
                            await send.send(frame)
            except BuboError as error:
                frames = encoder.error(error)
            except EngineError as error:
                frames = encoder.error(engine_error(error))
            except Exception:
                logger.exception("streaming failed")
                frames = encoder.error(InternalError("the server failed while streaming"))
            else:
                return
            self._ended = True
            for frame in frames:
                await send.send(frame)

    async def _relay(self, receive: trio.MemoryReceiveChannel[bytes]) -> AsyncIterator[bytes]:
        """The producer's frames, and a keep-alive whenever none came for the interval before the end."""
        async with receive:
            while True:
                frame: bytes | None = None
                with trio.move_on_after(self._keepalive_s):
                    try:
                        frame = await receive.receive()
                    except trio.EndOfChannel:
                        return
                if frame is None:
                    if self._ended:
                        continue
                    for keepalive in self._encoder.keepalive():
                        yield keepalive
                else:
                    yield frame

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._producer is not None:
            self._producer.cancel()  # a producer still running lost its reader: the decode is cancelled
        try:
            if self._frames is not None:
                await self._frames.aclose()  # type: ignore[attr-defined]
        finally:
            await self._stack.__aexit__(exc_type, exc_value, tb)


def sse_response(output: Output, encoder: StreamEncoder) -> Response:
    """A ``text/event-stream`` response, never cut by Quart's response timeout, with the app's keep-alives."""
    response = Response(
        EventStreamBody(output, encoder, keepalive_s=api_context().sse_keepalive_s),
        status=200,
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.timeout = None
    return response
