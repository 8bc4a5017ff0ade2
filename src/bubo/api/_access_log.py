"""The access log: one line per HTTP request, written when its exchange is over, however it ended.

Hypercorn's own access log (``HTTPStream``, 0.18) writes its line from two
places: when the response's last message is sent, and when the stream closes
before that.  A stream the client left is therefore logged with no status and
no response header (``"POST /api/chat 1.1" - - 132 s request_id=-``) though it
began with a 200 and an ``X-Request-Id``; and a response whose last write finds
the client gone is logged twice, once without a status (the close, reached from
inside the write) and once with it.  ``bubo serve`` turns that log off and this
middleware writes the one line instead, from what the app sent and received::

    127.0.0.1:50412 "POST /api/chat 1.1" 200 4711 2.048311s request_id=req_3f… client_left

Fields: the client's address, the method, path (no query string) and HTTP
version, the status sent (``-`` when none was: the client left first), the body
bytes sent, the seconds from the request's arrival to the end of the exchange,
the request id (the ``X-Request-Id`` the response carries), and how the
exchange ended when the app did not finish its response: ``client_left`` (the
client closed its connection first) or ``unfinished`` (the server stopped it:
shutdown, or a failure after the status was sent).  A failure before any status
gets 500 from Hypercorn, and that is logged.

It sits under :class:`~bubo.api._transport.TransportGuard`, which holds the
response's last message back until the framework's task is over: here that
message is seen when the app sends it, so a client that closes once it has the
whole response (every byte of a ``Content-Length``) is not said to have left.

The request id is decided here, before the app runs, by the function the app
gives (``server.py``: the client's own when it sent a sane one, else a new
``req_…``), and handed to the app in the scope (:data:`REQUEST_ID_KEY`), so a
request the client left before any header was sent is logged under the same id
the app used.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import trio

__all__ = ["ACCESS_LOGGER", "AccessLog", "header", "request_id_in"]

ACCESS_LOGGER = "bubo.access"
"""The logger the lines go to, at INFO (``--log-level warning`` silences them)."""

REQUEST_ID_KEY = "bubo.request_id"
"""The scope key that holds the request's id for the app."""

Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

logger = logging.getLogger(ACCESS_LOGGER)


def request_id_in(scope: Mapping[str, object]) -> str:
    """The id :class:`AccessLog` gave the request of *scope*."""
    return str(scope[REQUEST_ID_KEY])


def header(scope: Mapping[str, Any], name: bytes) -> str:
    """The first value of the request header *name* (lower case) in *scope*, or ``""``."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return ""


class AccessLog:
    """ASGI middleware: gives each HTTP request its id, and logs one line when its exchange is over."""

    def __init__(self, app: ASGIApp, request_id: Callable[[Mapping[str, Any]], str]) -> None:
        self._app = app
        self._request_id = request_id  # the id of a request, from its scope

    async def __call__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        exchange = _Exchange(receive, send, self._request_id(scope))
        failed = False
        try:
            await self._app({**scope, REQUEST_ID_KEY: exchange.request_id}, exchange.receive, exchange.send)
        except Exception:
            failed = True
            raise
        finally:
            logger.info("%s", exchange.line(scope, failed=failed))


class _Exchange:
    """What one request's exchange has seen so far: the status, the bytes, the end, the client leaving."""

    def __init__(self, receive: Receive, send: Send, request_id: str) -> None:
        self._receive = receive
        self._send = send
        self.request_id = request_id
        self._started = trio.current_time()
        self._status: int | None = None
        self._length: int | None = None  # the response's Content-Length, when it has one
        self._bytes = 0
        self._ending = False  # the response's last message was handed to the server
        self._client_left = False  # the client closed the connection before that

    async def receive(self) -> Message:
        message: Message = await self._receive()
        if message["type"] == "http.disconnect" and not self._ending:
            self._client_left = True
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._status = int(message["status"])
            self._length = _content_length(message.get("headers", ()))
        elif kind == "http.response.body":
            self._bytes += len(message.get("body", b""))
            # Set before the send: the disconnect that follows a finished response may come inside it.
            # Its last byte is the end of a response with a length: the client may close before the
            # (empty) last message, and has had it all.
            last = not message.get("more_body", False)
            whole = self._length is not None and self._bytes >= self._length
            self._ending = self._ending or last or whole
        await self._send(message)

    def line(self, scope: Mapping[str, Any], *, failed: bool) -> str:
        """The log line, once the app has returned (or raised: *failed*)."""
        status = self._status
        if status is None and failed and not self._client_left:
            status = 500  # what Hypercorn answers for an app that raised before sending a status
        if self._client_left:
            outcome = " client_left"
        elif not self._ending and not (failed and self._status is None):
            outcome = " unfinished"
        else:
            outcome = ""
        seconds = trio.current_time() - self._started
        return (
            f'{_client(scope)} "{scope.get("method", "-")} {_target(scope)} '
            f'{scope.get("http_version", "-")}" {"-" if status is None else status} {self._bytes} '
            f"{seconds:.6f}s request_id={self.request_id}{outcome}"
        )


def _target(scope: Mapping[str, Any]) -> str:
    """The path as the client sent it (percent-encoded, as nginx logs it), its control characters escaped.

    The decoded ``path`` would let ``%0A`` start a forged line; the raw one has no spaces or line
    breaks (HTTP's grammar), and escaping keeps it so whatever the server gave.
    """
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else str(scope.get("path", "-"))
    return json.dumps(path)[1:-1]


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _client(scope: Mapping[str, Any]) -> str:
    client = scope.get("client")
    if isinstance(client, (tuple, list)) and len(client) == 2:  # (host, port)
        return f"{client[0]}:{client[1]}"
    return "-"
