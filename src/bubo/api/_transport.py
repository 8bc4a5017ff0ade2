"""The ASGI edge under the framework: how each exchange ends, and WebSocket refused.

Three behaviours of Hypercorn 0.18 (pinned below 0.19), each reproduced on
Hypercorn alone in ``docs/design.md`` ("The Hypercorn coupling") and pinned by
``tests/test_hypercorn_coupling.py``:

1. **The disconnect comes from inside the last send.**  The app's final
   ``http.response.body`` send runs ``HTTPStream._send_closed``, which reaches
   ``H11Protocol._maybe_recycle`` (``H2Protocol.stream_send(StreamClosed)`` on
   HTTP/2): it first queues ``http.disconnect`` for the app
   (``HTTPStream.handle(StreamClosed)``), then closes a ``Connection: close``
   or HTTP/1.0 connection (``send(Closed())``), or re-arms the keep-alive timer
   (``Updated(idle=True)`` → ``TCPServer.idle_task.restart``).  quart-trio
   cancels the request's task group on that disconnect, and the task it
   cancels is the one still inside ``send()``: the close and the timer never
   happen, and every served connection stays open until the client leaves.
2. **DATA for a stream already answered raises.**  ``H2Protocol._handle_events``
   looks a ``DataReceived`` up in ``self.streams`` without the ``KeyError``
   guard it gives ``StreamEnded``; a stream leaves ``self.streams`` when its
   response ends.  An app that answers before the request body ended (an
   early 401, a CORS preflight, ``/health``) lets the client's next DATA frame
   raise ``KeyError`` out of ``TCPServer.run``, which ends
   ``hypercorn.trio.serve``.
3. **The queue into the app is bounded, and its reader waits on it.**
   ``TaskGroup.spawn_app`` gives the app a queue of ``max_app_queue_size``
   (10) messages; ``HTTPStream.handle(Body)``, awaited by the connection's
   reader (``TCPServer._read_data``), blocks once that many wait unread.

:class:`TransportGuard` therefore holds back the message that ends each
response and sends it itself once the framework's task has returned, where
nothing cancels it (1); on HTTP/2 it first waits until the client has ended its
request (or left, or :data:`REQUEST_END_WAIT_S` passed), so no frame can arrive
on a forgotten stream from a client that behaves (2); and it reads the request
meanwhile, so Hypercorn never waits on a queue nobody empties (3).

On HTTP/1.x the guard also writes each response header's name in its usual
capitals (``Content-Type``, ``Access-Control-Allow-Origin``), as llama-server
and most servers send them: names are case-insensitive, but a client that copies
the headers into a plain dict (llama.cpp's own test harness does) then finds
them under the names it expects.  HTTP/2 requires lower case and gets it.

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
            # Hypercorn's bookkeeping runs inside this send, after it queued http.disconnect (1):
            # sent by finish(), once the framework's task (which that disconnect cancels) is over.
            self._final = message
            return
        if message["type"] == "http.response.start" and not self._http2:
            message = {**message, "headers": [(name.title(), value) for name, value in message["headers"]]}
        await self._send(message)

    async def finish(self) -> None:
        """End the response: on HTTP/2 once the request is over, then send the held final message."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_rest)
            if self._http2:  # (2); bounded: a client that never ends its request cannot hold the stream
                with trio.move_on_after(REQUEST_END_WAIT_S):
                    await self._request_over.wait()
            if self._final is not None and not self._gone:
                await self._send(self._final)
            nursery.cancel_scope.cancel()

    async def _read_rest(self) -> None:
        """Take what the server still delivers (unread body, the disconnect) so it never waits on us (3)."""
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
