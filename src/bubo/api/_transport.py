"""The ASGI edge under the framework: how each exchange ends, and WebSocket refused.

Hypercorn does its connection bookkeeping inside the ``send()`` call that
ends a response: it closes a ``Connection: close`` (or HTTP/1.0) connection
there, re-arms the keep-alive timer there, and on HTTP/2 forgets the stream
there.  Two things go wrong with quart-trio on top:

- Hypercorn hands the app ``http.disconnect`` from inside that very call, and
  quart-trio answers it by cancelling the request's task group, which is the
  task still inside ``send()``.  The rest of the bookkeeping is cancelled:
  the socket is never closed and the keep-alive timer never runs again, so
  every served connection stays open until the client leaves.
- On HTTP/2, a DATA frame that arrives after the stream was forgotten (the app
  answered before the request body ended: an early 401, a CORS preflight,
  ``/health``) raises ``KeyError`` in Hypercorn, which stops the whole server.

:class:`TransportGuard` therefore holds back the message that ends each
response and sends it itself once the framework's task has returned, where
nothing cancels it; on HTTP/2 it first waits until the client has ended its
request (or left, or :data:`REQUEST_END_WAIT_S` passed), so no frame can arrive
on a forgotten stream from a client that behaves.  It keeps
reading the request meanwhile, so the server never blocks on a full queue.

There is no WebSocket endpoint: an upgrade gets a plain 400 in the error
envelope before any handshake, instead of reaching the framework.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from bubo.errors import BuboError, InvalidRequest

from ._errors import error_envelope
from ._json import dumps, unstructure

__all__ = ["REQUEST_END_WAIT_S", "ASGIApp", "TransportGuard", "error_body"]

REQUEST_END_WAIT_S = 10.0
"""How long an HTTP/2 answer waits for the client to end its request.  Past it the answer ends anyway:
a connection whose request never ends is not kept busy (and un-evictable at the connection cap) for
good; DATA that still comes late then fails only that connection under ``bubo serve``."""

# ASGI's own types are the server's (hypercorn.typing, re-exported by Quart as TypedDict unions);
# the guard reads a few keys of any message and passes the rest through untouched.
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def error_body(error: BuboError) -> bytes:
    """*error* in the error envelope, as the bytes of a JSON body."""
    return dumps(unstructure(error_envelope(error))).encode()


class TransportGuard:
    """ASGI middleware around the app (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await _refuse_websocket(scope, receive, send)
        elif scope["type"] == "http":
            exchange = _Exchange(receive, send, http2=scope.get("http_version") == "2")
            try:
                await self._app(scope, exchange.receive, exchange.send)
            finally:  # after an error too: Hypercorn then answers 500 and forgets the stream
                await exchange.finish()
        else:
            await self._app(scope, receive, send)


class _Exchange:
    """One HTTP request and its response, seen from between the server and the app."""

    def __init__(self, receive: Receive, send: Send, *, http2: bool) -> None:
        self._receive = receive
        self._send = send
        self._http2 = http2
        self._final: Message | None = None
        self._request_over = trio.Event()  # the client sent the whole request, or left
        self._gone = False

    async def receive(self) -> Message:
        message: Message = await self._receive()
        if message["type"] == "http.disconnect":
            self._gone = True
            self._request_over.set()
        elif message["type"] == "http.request" and not message.get("more_body", False):
            self._request_over.set()
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._final = message  # sent by finish(), once the framework's task is over
            return
        await self._send(message)

    async def finish(self) -> None:
        """End the response: on HTTP/2 once the request is over, then send the held final message."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_rest)
            if self._http2:  # bounded: a client that never ends its request cannot hold the stream
                with trio.move_on_after(REQUEST_END_WAIT_S):
                    await self._request_over.wait()
            if self._final is not None and not self._gone:
                await self._send(self._final)
            nursery.cancel_scope.cancel()

    async def _read_rest(self) -> None:
        """Take what the server still delivers (unread body, the disconnect) so it never waits on us."""
        while not self._gone:
            await self.receive()


async def _refuse_websocket(scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
    """Answer a WebSocket upgrade with a plain 400 (or, without the denial extension, a close)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client left before the handshake
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})  # the server answers 403
        return
    body = error_body(
        InvalidRequest(
            "this server does not accept WebSocket connections; send plain HTTP requests",
            code="websocket_not_supported",
        )
    )
    await send(
        {
            "type": "websocket.http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
