"""A minimal ASGI client for streams: long ones, and ones a client leaves mid-way.

quart-trio's test client buffers at most 10 body chunks before it reads any
(a longer stream deadlocks), and waits forever for the body of a handler that
was cancelled.  These helpers drive the app's ASGI callable directly with the
same ``http.request`` / ``http.disconnect`` events Hypercorn sends.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio


@attrs.define
class Exchange:
    """One request in flight."""

    _from_app: trio.MemoryReceiveChannel[dict[str, Any]]
    _to_app: trio.MemorySendChannel[dict[str, Any]]
    status: int | None = None
    headers: dict[str, str] = attrs.field(factory=dict)

    async def receive_chunk(self) -> bytes:
        """The next non-empty body chunk (the status is recorded on the way)."""
        while True:
            message = await self._from_app.receive()
            if message["type"] == "http.response.start":
                self._start(message)
            elif message["type"] == "http.response.body" and message.get("body"):
                return bytes(message["body"])

    async def read_all(self) -> bytes:
        """Every body chunk up to the end of the response."""
        body = bytearray()
        while True:
            message = await self._from_app.receive()
            if message["type"] == "http.response.start":
                self._start(message)
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    return bytes(body)

    def _start(self, message: dict[str, Any]) -> None:
        self.status = message["status"]
        self.headers = {bytes(k).decode().lower(): bytes(v).decode() for k, v in message.get("headers", ())}

    async def disconnect(self) -> None:
        """The client goes away."""
        await self._to_app.send({"type": "http.disconnect"})


@asynccontextmanager
async def exchange(
    app: Any,
    path: str,
    body: bytes,
    method: str = "POST",
    *,
    headers: Sequence[tuple[bytes, bytes]] = ((b"content-type", b"application/json"),),
    more_body: bool = False,
) -> AsyncIterator[Exchange]:
    """Run one request against *app*; leaving the block waits for the app to finish.

    *headers* follow ``Host: localhost``; with *more_body* the body is only its first part (the
    client never sends the rest).
    """
    to_app, app_receive = trio.open_memory_channel[dict[str, Any]](math.inf)
    app_send, from_app = trio.open_memory_channel[dict[str, Any]](math.inf)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "extensions": {},
    }
    await to_app.send({"type": "http.request", "body": body, "more_body": more_body})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, scope, app_receive.receive, app_send.send)
        yield Exchange(from_app, to_app)


async def post_stream(app: Any, path: str, payload: Any) -> bytes:
    """POST JSON and return the whole (streamed) response body."""
    async with exchange(app, path, json.dumps(payload).encode()) as connection:
        return await connection.read_all()
