"""What Bubo's transport relies on in Hypercorn 0.18, each shown on Hypercorn alone (docs/design.md).

``api/_transport.py`` works around three Hypercorn behaviours, the error
renderer in ``server.py`` a fourth, and ``transport.py`` rebuilds
``worker_serve`` from Hypercorn's internals.  Each
test here pins one of those upstream facts with a bare ASGI app (no Bubo, no
model), so that the day a Hypercorn release changes it, a test fails and the
``hypercorn<0.19`` pin can be lifted knowing which workaround to revisit.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.task_group import TaskGroup

from bubo.transport import ConnectionLimiter
from bubo.transport import serve as bubo_serve

WAIT_S = 10

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def app_answering(handler: Callable[[Receive, Send], Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """An ASGI app: the lifespan, and *handler* for every HTTP request."""

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        else:
            await handler(receive, send)

    return app


async def answer(send: Send, body: bytes = b"ok") -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


def config() -> Config:
    settings = Config()
    settings.bind = ["127.0.0.1:0"]
    settings.keep_alive_timeout = 60  # longer than any test: only what a test does closes a connection
    return settings


@asynccontextmanager
async def hypercorn(app: Callable[..., Awaitable[None]]) -> AsyncIterator[int]:
    """``hypercorn.trio.serve`` (what ``hypercorn bubo.app:app`` runs) on a free port; yields the port."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        (bind,) = await nursery.start(partial(hypercorn_serve, app, config(), shutdown_trigger=stop.wait))
        yield int(bind.rsplit(":", 1)[1])
        stop.set()


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


async def test_the_final_send_hands_the_app_its_disconnect_before_it_returns() -> None:
    """``HTTPStream._send_closed`` (in the app's last ``send``) reaches ``H11Protocol._maybe_recycle``,
    which queues ``http.disconnect`` for the app (``HTTPStream.handle(StreamClosed)``) and only then
    closes the connection or re-arms the keep-alive timer.  An app that cancels itself on the disconnect,
    as quart-trio does, cancels that bookkeeping: ``TransportGuard`` sends the last message itself."""
    log: list[str] = []

    async def handler(receive: Receive, send: Send) -> None:
        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            log.append("disconnect")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen)
            await answer(send)
            log.append("final send returned")

    async with hypercorn(app_answering(handler)) as port:
        with trio.fail_after(WAIT_S):
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                await read_to_eof(stream)
    assert log == ["disconnect", "final send returned"]


async def test_an_app_cancelled_by_that_disconnect_leaves_a_connection_close_connection_open() -> None:
    """The consequence: the ``Connection: close`` the response promised never happens."""

    async def handler(receive: Receive, send: Send) -> None:
        async with trio.open_nursery() as nursery:

            async def cancel_on_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(cancel_on_disconnect)
            await answer(send)
            await trio.sleep_forever()

    async with (
        hypercorn(app_answering(handler)) as port,
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
    ):
        await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        with trio.move_on_after(1) as waiting:  # a closing server answers within milliseconds
            await read_to_eof(stream)
    assert waiting.cancelled_caught, "Hypercorn now closes it: TransportGuard's held final message may go"


async def test_data_for_a_stream_it_already_answered_ends_hypercorns_serve() -> None:
    """``H2Protocol._handle_events`` looks a DATA frame's stream up in ``self.streams`` without the
    ``KeyError`` guard it gives ``StreamEnded``; the stream is gone once its response ended.  The
    ``KeyError`` escapes ``TCPServer.run`` and ends ``serve()``: ``TransportGuard`` waits for the
    request's end on HTTP/2, and ``bubo serve`` runs each connection behind its own error barrier."""

    async def handler(_receive: Receive, send: Send) -> None:
        await answer(send)  # before the request body ended, as an early 401 or /health does

    async def serve_and_send_late_data() -> None:
        with trio.fail_after(WAIT_S):
            async with hypercorn(app_answering(handler)) as port:
                await answered_then_data(port)

    with pytest.raises(BaseExceptionGroup) as raised:
        await serve_and_send_late_data()
    assert raised.group_contains(KeyError)


async def answered_then_data(port: int) -> None:
    """Over HTTP/2: a POST whose answer ends before its body, then the body."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":path", "/"), (":scheme", "http"), (":authority", "x")])
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(client.data_to_send())
        answered = False
        while not answered:
            events = client.receive_data(await stream.receive_some())
            answered = any(isinstance(e, h2.events.StreamEnded) for e in events)
            await stream.send_all(client.data_to_send())
        client.send_data(1, b"late", end_stream=True)
        await stream.send_all(client.data_to_send())
        await trio.sleep_forever()  # until serve() fails


async def test_the_queue_into_an_app_is_bounded_and_a_full_one_blocks_the_reader() -> None:
    """``TaskGroup.spawn_app`` gives the app a queue of ``max_app_queue_size`` messages, and the put
    (``HTTPStream.handle(Body)``, awaited by the connection's reader) blocks once that many wait unread:
    ``TransportGuard`` reads the rest of every request so Hypercorn never waits on it."""
    release = trio.Event()

    async def never_reads(_scope: object, _receive: Receive, _send: Send) -> None:
        await release.wait()

    async def sent(_message: object) -> None:
        pass

    settings = Config()
    puts = 0
    async with TaskGroup() as group:
        put = await group.spawn_app(ASGIWrapper(never_reads), settings, {"type": "http"}, sent)  # type: ignore[arg-type]

        async def feed() -> None:
            nonlocal puts
            while True:
                await put({"type": "http.request", "body": b"x", "more_body": True})
                puts += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        release.set()
    assert puts == settings.max_app_queue_size == 10


async def test_a_response_that_ends_before_its_request_closes_a_keep_alive_connection() -> None:
    """``H11Protocol._maybe_recycle`` keeps a connection alive only when both sides of h11's cycle are
    done; an answer that ends while the request body is still coming closes it.  Bubo's error renderer
    reads what is left of the body before answering, so a 401 or 404 keeps the client's connection."""

    async def handler(_receive: Receive, send: Send) -> None:
        await answer(send)

    async with (
        hypercorn(app_answering(handler)) as port,
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
    ):
        with trio.fail_after(WAIT_S):
            await stream.send_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\n")
            response = b""
            while not response.endswith(b"ok"):
                response += await stream.receive_some()
            assert await read_to_eof(stream) == b""  # closed, not kept alive (keep_alive_timeout is 60 s)


async def test_the_internals_bubo_serve_rebuilds_worker_serve_from_still_fit() -> None:
    """``bubo serve`` runs Hypercorn's ``Lifespan``, ``WorkerContext`` and per-connection ``TCPServer``
    itself: a request is answered, and at shutdown ``WorkerContext.terminated`` closes an idle keep-alive
    connection at once (``TCPServer._idle_timeout`` waits on it), as ``worker_serve`` does."""

    async def handler(_receive: Receive, send: Send) -> None:
        await answer(send)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = config()
    settings.bind = [f"127.0.0.1:{port}"]
    stop = trio.Event()
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(
                    bubo_serve,
                    app_answering(handler),
                    settings,
                    ConnectionLimiter(8),
                    shutdown_trigger=stop.wait,
                )
            )
            async with await connect_when_listening(port) as stream:
                await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                response = b""
                while not response.endswith(b"ok"):
                    response += await stream.receive_some()
                assert response.startswith(b"HTTP/1.1 200")
                stop.set()
                assert await read_to_eof(stream) == b""  # closed by the shutdown, not by keep_alive_timeout


async def connect_when_listening(port: int) -> trio.SocketStream:
    while True:
        try:
            return await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.sleep(0.05)
