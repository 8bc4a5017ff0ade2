"""``bubo serve``'s connections: the open-file limit raised, the cap kept below it, who makes room at the cap."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypercorn.config import Config

from bubo.transport import FD_RESERVE, FRESH_GRACE_S, ConnectionLimiter, ConnectionStatistics, serve


def test_soft_open_file_limit_is_raised_to_the_hard_limit() -> None:
    probe = (
        "import resource; from bubo.transport import raise_open_file_limit; "
        "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    result = subprocess.run(
        ["sh", "-c", 'ulimit -S -n 256 && ulimit -H -n 512 && exec "$0" "$@"', sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.split() == ["512", "512"]


def test_cap_is_kept_below_the_descriptor_limit(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bubo.transport"):
        limiter = ConnectionLimiter.below_descriptor_limit(1000, 256)
    assert limiter.cap == 256 - FD_RESERVE
    assert "not --max-connections 1000" in caplog.text


def test_cap_as_asked_when_descriptors_suffice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bubo.transport"):
        limiter = ConnectionLimiter.below_descriptor_limit(32, 1 << 20)
    assert limiter.cap == 32
    assert not caplog.text


# ---- which connection makes room at the cap -----------------------------------------------------------

WAIT_S = 20  # a bound on waits that should end at once on loopback (a hang guard, not a timing check)
UPLOAD_HEAD = b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any, *, release: trio.Event) -> None:
    """A bare ASGI app: reads each request's body whole, holds ``/busy`` until *release*, answers ``ok``."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].removeprefix("lifespan.")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    while (message := await receive())["type"] != "http.disconnect" and message.get("more_body"):
        pass
    if message["type"] == "http.disconnect":
        return
    if scope["path"] == "/busy":
        await release.wait()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@attrs.define
class Served:
    """A running :func:`served` server, and the client connections a test opened to it."""

    limiter: ConnectionLimiter
    port: int
    release: trio.Event  # lets every /busy request answer
    clients: list[trio.SocketStream] = attrs.field(factory=list)

    async def connect(self, source: str = "127.0.0.1") -> trio.SocketStream:
        with trio.fail_after(WAIT_S):
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", self.port, local_address=source)
                except OSError:
                    await trio.sleep(0.01)  # the listener is not up yet
                else:
                    self.clients.append(stream)
                    return stream


@asynccontextmanager
async def served(cap: int) -> AsyncIterator[Served]:
    """``bubo.transport.serve`` of :func:`app` with a cap of *cap* connections, on a free port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_timeout = 60  # longer than any test: only the limiter closes connections
    config.graceful_timeout = 0
    server = Served(ConnectionLimiter(cap), port, trio.Event())
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        asgi = partial(app, release=server.release)
        nursery.start_soon(partial(serve, asgi, config, server.limiter, shutdown_trigger=stop.wait))
        try:
            yield server
        finally:
            for stream in server.clients:
                await stream.aclose()
            server.release.set()
            stop.set()


async def settled(limiter: ConnectionLimiter, expected: ConnectionStatistics) -> None:
    """Wait until the limiter sees the connections in the *expected* states."""
    with trio.fail_after(WAIT_S):
        while limiter.statistics() != expected:
            await trio.sleep(0.01)


async def answered(stream: trio.SocketStream) -> bytes:
    """The status line of the server's next answer on *stream* (read whole), or b"" if it closed the connection."""
    data = b""
    with trio.fail_after(WAIT_S):
        while not data.endswith(b"ok"):  # app's answer; a refusal ends with the connection
            try:
                chunk = await stream.receive_some()
            except trio.BrokenResourceError:  # a reset: closed too
                break
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n", 1)[0]


def stats(*, idle: int = 0, uploading: int = 0, fresh: int = 0, busy: int = 0) -> ConnectionStatistics:
    return ConnectionStatistics(idle=idle, uploading=uploading, fresh=fresh, busy=busy)


async def test_a_slow_upload_makes_room_and_a_running_request_does_not() -> None:
    """At the cap, /health takes the place of the upload that began first; the other upload completes."""
    async with served(cap=3) as server:
        first, second, running = [await server.connect() for _ in range(3)]
        await first.send_all(UPLOAD_HEAD + b"{")
        await settled(server.limiter, stats(uploading=1, fresh=2))
        await second.send_all(UPLOAD_HEAD + b"{")
        await running.send_all(b"POST /busy HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await settled(server.limiter, stats(uploading=2, busy=1))
        newcomer = await server.connect()
        await newcomer.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert await answered(newcomer) == b"HTTP/1.1 200 "
        assert await answered(first) == b""  # closed for the newcomer
        await second.send_all(b" " * 999)
        assert await answered(second) == b"HTTP/1.1 200 "
        server.release.set()
        assert await answered(running) == b"HTTP/1.1 200 "


async def test_idle_connections_make_room_before_uploads_and_uploads_before_new_ones() -> None:
    async with served(cap=3) as server:
        fresh, uploading, idle = [await server.connect() for _ in range(3)]
        await uploading.send_all(UPLOAD_HEAD)
        await idle.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert await answered(idle) == b"HTTP/1.1 200 "
        await settled(server.limiter, stats(idle=1, uploading=1, fresh=1))
        await server.connect()
        assert await answered(idle) == b""
        await settled(server.limiter, stats(uploading=1, fresh=2))
        await server.connect()
        assert await answered(uploading) == b""
        await settled(server.limiter, stats(fresh=3))
        await server.connect()
        assert await answered(fresh) == b""  # the fresh one open longest


async def test_a_connection_silent_past_the_grace_makes_room_before_an_upload(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A socket that never sent a request (closed or forgotten by its client) counts as idle after a while."""
    mock_clock.rate = 1  # real time runs; jump() adds the grace at once
    async with served(cap=2) as server:
        silent = await server.connect()
        await settled(server.limiter, stats(fresh=1))
        mock_clock.jump(FRESH_GRACE_S)
        uploading = await server.connect()
        await uploading.send_all(UPLOAD_HEAD)
        await settled(server.limiter, stats(fresh=1, uploading=1))
        await server.connect()
        assert await answered(silent) == b""
        await uploading.send_all(b" " * 1000)
        assert await answered(uploading) == b"HTTP/1.1 200 "


async def test_the_address_holding_most_connections_makes_room_first() -> None:
    """An upload from 127.0.0.2 began first, yet one of 127.0.0.1's two uploads is closed."""
    async with served(cap=3) as server:
        other = await server.connect(source="127.0.0.2")
        await other.send_all(UPLOAD_HEAD)
        await settled(server.limiter, stats(uploading=1))
        mine = [await server.connect() for _ in range(2)]
        for stream in mine:
            await stream.send_all(UPLOAD_HEAD)
        await settled(server.limiter, stats(uploading=3))
        await server.connect()
        assert await answered(mine[0]) == b""
        await other.send_all(b" " * 1000)
        assert await answered(other) == b"HTTP/1.1 200 "


async def test_a_newcomer_is_refused_when_every_connection_has_a_request_running() -> None:
    async with served(cap=2) as server:
        for _ in range(2):
            stream = await server.connect()
            await stream.send_all(b"POST /busy HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await settled(server.limiter, stats(busy=2))
        refused = await server.connect()
        assert await answered(refused) == b"HTTP/1.1 503 Service Unavailable"
