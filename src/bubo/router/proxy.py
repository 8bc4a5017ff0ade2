"""Forwarding one request to a child and its response back, byte for byte as it arrives.

The request goes out with the router's request id and the child's key in
place of the client's; the response streams back through :class:`ProxiedBody`
(Quart's ``ResponseBody`` contract): each chunk is passed on as soon as httpx
reads it, and leaving the body (the client went away: quart-trio cancels the
request) closes the upstream response, so the child sees the disconnect and
frees its slot.  A child that dies before answering gives a 503 in the
dialect's error shape; one that dies mid-stream ends an event stream with the
dialect's error event (an Ollama NDJSON stream with an ``{"error"}`` line).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, suppress
from types import TracebackType
from typing import Any, Literal

import httpx
import trio
from quart import Response
from quart.wrappers.response import ResponseBody
from werkzeug.datastructures import Headers

from bubo.api._errors import error_envelope
from bubo.api._json import dumps, unstructure
from bubo.api.anthropic.errors import error_envelope as anthropic_error_envelope
from bubo.api.ollama import wire as ollama_wire
from bubo.errors import BuboError

__all__ = ["Dialect", "ProxiedBody", "forward", "forwarded_headers"]

logger = logging.getLogger(__name__)

# Headers that belong to one connection, not to the message (RFC 9110, 7.6.1), plus those the
# router sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The router's edge has checked the browser boundary (Origin, Sec-Fetch-Site): the child would judge them
# against its own loopback Host, not the router's name.
_NOT_FORWARDED_UP = _HOP_BY_HOP | {
    "host",
    "content-length",
    "authorization",
    "x-api-key",
    "x-request-id",
    "origin",
    "sec-fetch-site",
}
_NOT_FORWARDED_DOWN = _HOP_BY_HOP | {"date", "server", "x-request-id"}
CLOSE_UPSTREAM_S = 2.0  # closing the child's response after the client left

Failure = Callable[[], Awaitable[BuboError]]
ErrorFrame = Callable[[BuboError, int], bytes]  # the error, the number of events already passed on
Dialect = Literal["anthropic", "responses", "openai", "ollama"]  # whose error event ends a broken stream
SSE_END = b"\n\n"  # what ends a server-sent event
NDJSON_END = b"\n"  # what ends a line of an NDJSON stream (Ollama's)


def forwarded_headers(
    incoming: Iterable[tuple[str, str]], child: Mapping[str, str], request_id: str
) -> list[tuple[str, str]]:
    """The headers sent to the child: the client's, less its key, its Origin and the hop-by-hop ones."""
    headers = [(k, v) for k, v in incoming if k.lower() not in _NOT_FORWARDED_UP]
    headers.extend(child.items())
    headers.append(("X-Request-Id", request_id))
    return headers


class Once:
    """A callback that runs at most once, however many ways a response can end."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback: Callable[[], None] | None = callback

    def __call__(self) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


async def forward(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    failure: Failure,
    dialect: Dialect,
    request_id: str,
    on_close: Callable[[], None] = lambda: None,
) -> Response:
    """Send *request* to the child and answer with its response, streamed.

    *on_close* runs once when the response has ended: its body left (sent, or the client gone), or
    dropped unsent, or no answer came.

    Raises:
        BuboError: the child could not be reached or closed the connection before answering
            (*failure* says which error, e.g. 503 ``model_failed``).

    """
    close = Once(on_close)
    try:
        upstream = await client.send(request, stream=True)
    except httpx.TransportError as error:
        close()
        logger.warning("the child did not answer %s %s: %r", request.method, request.url.path, error)
        raise await failure() from error
    except BaseException:
        close()
        raise
    headers = Headers(
        [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in _NOT_FORWARDED_DOWN]
    )
    content_type = upstream.headers.get("content-type", "")
    end = SSE_END if content_type.startswith("text/event-stream") else None
    if content_type.startswith("application/x-ndjson"):
        end = NDJSON_END
    body = ProxiedBody(
        upstream,
        failure=failure,
        error_frame=_error_frame(dialect, request_id) if end is not None else None,
        frame_end=end or SSE_END,
        on_close=close,
    )
    response = Response(body, status=upstream.status_code, headers=headers)
    response.timeout = None  # the child applies its own limits; a long stream must not be cut here
    return response


class ProxiedBody(ResponseBody):
    """The child's response body, passed on chunk by chunk; leaving it closes the child's response.

    A task in the body's own nursery reads the child's response and hands each
    chunk on through an unbuffered channel: it reads the next chunk only once the
    client has taken the last, so a client that stops reading stops the child
    (back-pressure through the connection) instead of the router holding the whole
    generation.  Leaving the body cancels the reader and closes the connection to
    the child.  A child that dies mid-event has its error event start on a fresh
    line pair, so that event parses whatever the child cut off.
    """

    def __init__(
        self,
        upstream: httpx.Response,
        *,
        failure: Failure,
        error_frame: ErrorFrame | None,
        frame_end: bytes = SSE_END,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self._upstream = upstream
        self._frame_end = frame_end
        self._on_close = on_close
        weakref.finalize(self, on_close)  # a body dropped unsent (the client left first) ends too
        self._failure = failure
        self._error_frame = error_frame
        self._frames_sent = 0  # complete server-sent events passed on (the next sequence_number)
        self._tail = b"\n\n"  # the last two bytes passed on: b"\n\n" after a complete event
        self._stack = AsyncExitStack()
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> AsyncIterator[bytes]:
        send, receive = trio.open_memory_channel[bytes](0)
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._nursery.start_soon(self._read, send)
        self._stack.push_async_callback(receive.aclose)
        return receive

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        try:
            await self._stack.aclose()
        finally:
            # Shielded so that a cancelled request (the client left) still closes the connection to
            # the child at once, which is how the child learns to stop generating.
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_UPSTREAM_S):
                await self._upstream.aclose()
            self._on_close()

    async def _read(self, send: trio.MemorySendChannel[bytes]) -> None:
        chunks = self._upstream.aiter_raw()
        async with send:
            try:
                async for chunk in chunks:
                    if chunk:
                        self._frames_sent += chunk.count(b"\n\n")
                        self._tail = (self._tail + chunk)[-2:]
                        await send.send(chunk)
            except httpx.TransportError:
                error = await self._failure()
                logger.warning("the child stopped while streaming a response: %s", error.message)
                if self._error_frame is not None:
                    end = self._frame_end  # end the event (or line) the child cut off
                    fresh = b"" if self._tail.endswith(end) else end
                    await send.send(fresh + self._error_frame(error, self._frames_sent))
            finally:
                await self._unwind(chunks)

    async def _unwind(self, chunks: AsyncIterator[bytes]) -> None:
        """Close the child's response and run httpx's readers to their end.

        Cancelled while it waits for the client, the reader leaves httpx's nested async generators
        suspended: closing the connection first makes their next read fail inside them, so each one
        finishes rather than being left to the garbage collector.
        """
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_UPSTREAM_S):
            await self._upstream.aclose()
            with suppress(httpx.HTTPError):
                async for _ in chunks:
                    pass


def _error_frame(dialect: Dialect, request_id: str) -> ErrorFrame:
    """The event that ends a stream whose child died, in the stream's dialect (``api/*/stream.py``)."""

    def frame(error: BuboError, sequence_number: int) -> bytes:
        if dialect == "anthropic":
            return _sse("error", unstructure(anthropic_error_envelope(error, request_id)))
        if dialect == "ollama":
            return (dumps(unstructure(ollama_wire.ErrorBody(error=error.message))) + "\n").encode()
        if dialect == "responses":
            data = {"code": error.code, "message": error.message, "param": error.param}
            return _sse("error", {"type": "error", "sequence_number": sequence_number, **data})
        return _sse(None, unstructure(error_envelope(error)))

    return frame


def _sse(event: str | None, data: Any) -> bytes:
    prefix = f"event: {event}\n" if event is not None else ""
    return f"{prefix}data: {dumps(data)}\n\n".encode()
