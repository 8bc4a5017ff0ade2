"""Server-sent events: frame encoding and a Quart response body that owns a generation.

:class:`EventStreamBody` follows Quart's ``ResponseBody`` contract
(``async with body as frames: async for frame in frames``): ``__aenter__``
waits for the slot and opens the generation, iteration encodes its output
events, ``__aexit__`` closes it, which cancels the decode if the client left
(quart-trio cancels the request's nursery on ``http.disconnect``).  No
generator here holds a nursery or cancel scope across a ``yield``.

Errors after the headers are sent cannot change the status any more; each
dialect's encoder turns them into its own in-stream error event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Protocol

from quart import Response
from quart.wrappers.response import ResponseBody

from bubo.domain.output import OutputEvent
from bubo.errors import BuboError, InternalError

__all__ = ["EventStreamBody", "StreamEncoder", "sse_frame", "sse_response"]

logger = logging.getLogger(__name__)


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


Output = AbstractAsyncContextManager[AsyncIterator[OutputEvent]]


class EventStreamBody(ResponseBody):
    """A response body that runs one generation and streams it as SSE.

    *output* was admitted by the handler (so a full queue is still a plain
    503); entering it waits for the slot, after the headers went out, so an
    error from then on is reported in the stream.
    """

    def __init__(self, output: Output, encoder: StreamEncoder) -> None:
        self._output = output
        self._encoder = encoder
        self._stack = AsyncExitStack()
        self._frames: AsyncIterator[bytes] | None = None

    async def __aenter__(self) -> AsyncIterator[bytes]:
        try:
            events = await self._stack.enter_async_context(self._output)
        except BuboError as error:
            self._frames = self._report(error)
        except Exception:
            logger.exception("the generation failed to start")
            self._frames = self._report(InternalError("the server failed while streaming"))
        else:
            self._frames = self._encode(events)
        return self._frames

    async def _report(self, error: BuboError) -> AsyncIterator[bytes]:
        for frame in self._encoder.error(error):
            yield frame

    async def _encode(self, output: AsyncIterator[OutputEvent]) -> AsyncIterator[bytes]:
        encoder = self._encoder
        for frame in encoder.opening():
            yield frame
        try:
            async for event in output:
                for frame in encoder.encode(event):
                    yield frame
        except BuboError as error:
            for frame in encoder.error(error):
                yield frame
        except Exception:
            logger.exception("streaming failed")
            for frame in encoder.error(InternalError("the server failed while streaming")):
                yield frame

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._frames is not None:
            await self._frames.aclose()  # type: ignore[attr-defined]
        await self._stack.__aexit__(exc_type, exc_value, tb)


def sse_response(output: Output, encoder: StreamEncoder) -> Response:
    """A ``text/event-stream`` response that is never cut by Quart's response timeout."""
    response = Response(
        EventStreamBody(output, encoder),
        status=200,
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.timeout = None
    return response
