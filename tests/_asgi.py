"""A minimal ASGI client that can disconnect mid-response, as Hypercorn does.

quart-trio's test client waits forever for a response body that a cancelled
handler never finishes, so disconnect tests drive the app's ASGI callable
directly: the same ``http.request`` / ``http.disconnect`` events Hypercorn sends.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
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

    async def receive_chunk(self) -> bytes:
        """The next non-empty body chunk (the status is recorded on the way)."""
        while True:
            message = await self._from_app.receive()
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body" and message.get("body"):
                return bytes(message["body"])

    async def disconnect(self) -> None:
        """The client goes away."""
        await self._to_app.send({"type": "http.disconnect"})


@asynccontextmanager
async def exchange(app: Any, path: str, body: bytes, method: str = "POST") -> AsyncIterator[Exchange]:
    """Run one request against *app*; leaving the block waits for the app to finish."""
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
        "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "extensions": {},
    }
    await to_app.send({"type": "http.request", "body": body, "more_body": False})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, scope, app_receive.receive, app_send.send)
        yield Exchange(from_app, to_app)
