"""``bubo serve``'s listener: Hypercorn's HTTP protocol under Bubo's own accept loop.

``hypercorn.trio.serve`` accepts every connection and runs each in the
server's own nursery, so it has no answer to two things a public server needs:

- **A cap on open connections.**  Each one holds a file descriptor; once the
  process runs out, nobody can connect, ``/health`` included.  Here at most
  ``max_connections`` are open (kept below the descriptor limit, which is
  raised toward its hard limit at start).  At the cap a newcomer takes the
  place of a connection that holds no running request: one idle between
  requests, else one still uploading its request body (a client holding many
  slow uploads cannot fill the cap), else one still sending its first request
  (:class:`ConnectionLimiter`).  When every connection has a request
  running, with its body in, the newcomer gets a plain 503
  ``too_many_connections`` and is closed.
- **One connection's failure stays its own.**  ``worker_serve`` runs each
  connection's ``TCPServer`` in one handler nursery (``trio.serve_listeners``),
  and ``TCPServer.run`` catches only ``OSError``: anything else its protocol
  code raises (``H2Protocol`` raises ``KeyError`` on a client's DATA for a
  stream already answered, see ``api/_transport.py``) ends that nursery,
  ``serve()`` and the process.  Here it is logged and only that connection is
  closed.

The rest is Hypercorn's ``hypercorn.trio.run.worker_serve`` (0.18) for a
plain-TCP worker, built from the same internals: ``Lifespan(app, config,
state)`` around serving, ``WorkerContext(None)``, one ``TCPServer(app, config,
context, state, stream)`` per connection (HTTP/1.1, h2c, keep-alive timeout),
and at shutdown ``WorkerContext.terminated`` set (``TCPServer._idle_timeout``
waits on it: idle keep-alive connections close at once) with
``graceful_timeout`` for the rest.  ``tests/test_hypercorn_coupling.py`` runs
those internals as used here.  Under ``hypercorn bubo.app:app`` none of this
applies: Hypercorn runs its own loop.
"""

from __future__ import annotations

import logging
import resource
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Literal, cast

import attrs
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ConnectionState,
    LifespanState,
    Scope,
)
from hypercorn.utils import repr_socket_addr

from bubo.api._transport import error_body
from bubo.errors import ServiceUnavailable

__all__ = ["FD_RESERVE", "ConnectionLimiter", "ConnectionStatistics", "raise_open_file_limit", "serve"]

logger = logging.getLogger(__name__)

# Descriptors kept out of the connection cap: the process's own (14 measured when serving:
# stdio, log, epoll, trio's wake-up sockets, the listener; the model is mmapped, its file
# closed) with room for files opened in passing, and refusals in flight (REFUSALS_AT_ONCE).
FD_RESERVE = 64
REFUSALS_AT_ONCE = 16
# How long a refusal may take to write the 503 and read what the client already sent
# (so closing does not reset the connection before the client has read the answer).
REFUSAL_GRACE_S = 1.0
REFUSAL_READ_LIMIT = 64 * 1024
# Soft limits tried, highest first, when the hard limit is unlimited (macOS allows at most 10240).
_UNLIMITED_TARGETS = (1 << 20, 65536, 10240)


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE toward the hard limit where allowed; return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    targets = _UNLIMITED_TARGETS if hard == resource.RLIM_INFINITY else (hard,)
    for target in targets:
        if soft != resource.RLIM_INFINITY and target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        return target
    return soft


# A new connection's time to send its first request before its place at the cap counts as idle: a
# client sends its headers at once (on loopback, within a millisecond), a closed or forgotten socket
# never does (Hypercorn notices only at the keep-alive timeout).
FRESH_GRACE_S = 1.0

# What an open connection holds (ConnectionStatistics), and which make room at the cap, first to last.
Holding = Literal["idle", "fresh", "uploading", "busy"]
_ROOM_ORDER: dict[Holding, int] = {"idle": 0, "uploading": 1, "fresh": 2}


@attrs.define(eq=False)
class _Connection:
    key: tuple[object, ...]  # the client's (address, port), as in the ASGI scope
    stream: trio.SocketStream
    requests: int = 0  # in the app now (HTTP/2 runs several at once)
    uploading: int = 0  # of those, the ones whose body has not all arrived
    served: bool = False  # a request of it has finished (an idle one is between keep-alive requests)
    # when it opened, last went idle, or began uploading (trio's clock)
    since: float = attrs.field(factory=trio.current_time)

    def holding(self) -> Holding:
        """What it holds: ``uploading`` when every request of it still receives its body."""
        if self.requests == 0:
            return "idle" if self.served else "fresh"
        return "uploading" if self.uploading == self.requests else "busy"

    def room_rank(self, now: float) -> int | None:
        """How soon this connection makes room for a newcomer (lower: sooner); None: it never does."""
        holding = self.holding()
        if holding == "fresh" and now - self.since >= FRESH_GRACE_S:
            holding = "idle"
        return _ROOM_ORDER.get(holding)


@attrs.frozen
class ConnectionStatistics:
    """The open connections by what they hold (:meth:`ConnectionLimiter.statistics`)."""

    idle: int  # between keep-alive requests
    uploading: int  # every request of it still receiving its body
    fresh: int  # no whole request yet
    busy: int  # a request running with its body in: never closed to make room


@attrs.define
class ConnectionLimiter:
    """At most *cap* connections open; at the cap one holding no running request makes room, else 503.

    A newcomer at the cap takes the place of, in this order:

    1. a connection idle between keep-alive requests (as a keep-alive timeout
       would close it), or open :data:`FRESH_GRACE_S` and more without a
       whole request;
    2. one whose requests are all still receiving their bodies: a slow upload
       costs the server nothing yet, and its client can send it again, while
       one client holding the cap with uploads that trickle in would otherwise
       lock everyone out, ``/health`` included;
    3. one opened less than :data:`FRESH_GRACE_S` ago that has not sent a
       whole request yet, last: a client that just connected, ``/health``'s
       included, is one of these, and a stream of newcomers must not push it
       out before its headers arrive.

    Within each, the connections of the client address holding the most go
    first, then the one longest in that state.  A local attacker and the
    user's own agents both come from 127.0.0.1, so no per-address cap could
    tell them apart: what keeps ``/health`` answering is that holding a
    connection without a running request buys no place at the cap.  Only when
    every connection has a request running, its body in, is the newcomer
    refused; those are bounded by the slots and ``--max-queue`` (waiting for a
    slot, and waiting for a worker to read a body: ``service.work.Workers``).
    """

    cap: int
    _open: dict[tuple[object, ...], _Connection] = attrs.field(init=False, factory=dict)
    _refusing: trio.CapacityLimiter = attrs.field(
        init=False, factory=lambda: trio.CapacityLimiter(REFUSALS_AT_ONCE)
    )
    _warned: bool = attrs.field(init=False, default=False)

    @classmethod
    def below_descriptor_limit(cls, wanted: int, open_file_limit: int) -> ConnectionLimiter:
        """*wanted* connections, or fewer if the descriptor limit leaves less (said in the log)."""
        cap = max(1, min(wanted, open_file_limit - FD_RESERVE))
        if cap < wanted:
            logger.warning(
                "serving at most %d connections, not --max-connections %d: this process may open only "
                "%d files (raise `ulimit -n`)",
                cap,
                wanted,
                open_file_limit,
            )
        return cls(cap)

    @property
    def open(self) -> int:
        """Connections being served now."""
        return len(self._open)

    def statistics(self) -> ConnectionStatistics:
        """How many open connections are in each state (which ones could make room)."""
        held = Counter(c.holding() for c in self._open.values())
        return ConnectionStatistics(
            idle=held["idle"], uploading=held["uploading"], fresh=held["fresh"], busy=held["busy"]
        )

    def track(self, app: ASGIFramework) -> ASGIFramework:
        """*app*, counting each connection's requests in it and those still receiving their bodies."""

        async def tracked(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
            client = scope.get("client")
            connection = self._open.get(tuple(client)) if isinstance(client, tuple) else None
            if connection is None:
                await app(scope, receive, send)
                return
            connection.requests += 1
            connection.uploading += 1
            if connection.uploading == 1:
                connection.since = trio.current_time()
            body_in = False

            async def receive_tracked() -> ASGIReceiveEvent:
                nonlocal body_in
                message = await receive()
                if not body_in and (message["type"] == "http.disconnect" or not message.get("more_body")):
                    body_in = True
                    connection.uploading -= 1
                return message

            try:
                await app(scope, receive_tracked, send)
            finally:
                if not body_in:
                    connection.uploading -= 1
                connection.requests -= 1
                connection.served = True
                connection.since = trio.current_time()

        return tracked

    async def handle(
        self, stream: trio.SocketStream, serve: Callable[[trio.SocketStream], Awaitable[None]]
    ) -> None:
        """Serve *stream* within the cap (closing one with no running request if need be), or refuse it."""
        try:
            key = tuple(stream.socket.getpeername()[:2])
        except OSError:
            return  # the client is already gone
        making_room = None
        if len(self._open) >= self.cap:
            making_room = self._making_room()
            if making_room is None:
                await self._refuse(stream)
                return
            del self._open[making_room.key]
        # Counted before the first checkpoint, so connections accepted meanwhile see the cap right.
        connection = self._open[key] = _Connection(key, stream)
        try:
            if making_room is not None:
                await making_room.stream.aclose()  # its reader sees the close; Hypercorn ends it
            await serve(stream)
        finally:
            if self._open.get(key) is connection:
                del self._open[key]
            if len(self._open) < self.cap:
                self._warned = False

    def _making_room(self) -> _Connection | None:
        """The connection to close for a newcomer (see the class's docstring), or None: all are busy."""
        held = Counter(key[0] for key in self._open)
        now = trio.current_time()
        ranks = {
            c: (room, -held[c.key[0]], c.since)
            for c in self._open.values()
            if (room := c.room_rank(now)) is not None
        }
        return min(ranks, key=ranks.__getitem__, default=None)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "%d connections open, each with a request running (--max-connections): "
                "new connections get 503 until some finish",
                self.cap,
            )
        try:
            self._refusing.acquire_on_behalf_of_nowait(stream)
        except trio.WouldBlock:
            return  # refusals already hold their share of descriptors: just close
        try:
            with trio.move_on_after(REFUSAL_GRACE_S):
                await stream.send_all(_too_many_connections(self.cap))
                await stream.send_eof()
                await _read_what_was_sent(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._refusing.release_on_behalf_of(stream)


async def _read_what_was_sent(stream: trio.SocketStream) -> None:
    """Read (a bounded amount) until the client closes: closing on unread data would reset the 503."""
    received = 0
    while received < REFUSAL_READ_LIMIT:
        data = await stream.receive_some(REFUSAL_READ_LIMIT)
        if not data:
            return
        received += len(data)


def _too_many_connections(cap: int) -> bytes:
    body = error_body(
        ServiceUnavailable(
            f"the server already has {cap} open connections (its --max-connections); retry shortly",
            code="too_many_connections",
        )
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "retry-after: 1\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


async def serve(
    app: ASGIFramework,
    config: Config,
    limiter: ConnectionLimiter,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
) -> None:
    """Serve *app* on ``config.bind`` until *shutdown_trigger* returns, then shut down gracefully."""
    wrapped = ASGIWrapper(limiter.track(app))
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)

    async def serve_connection(stream: trio.SocketStream) -> None:
        # Annotated as the TLS stream, TCPServer takes plain TCP streams too (as Hypercorn's own worker does).
        tls_or_tcp = cast("trio.SSLStream[trio.SocketStream]", stream)
        server = TCPServer(wrapped, config, context, ConnectionState(lifespan_state.copy()), tls_or_tcp)
        try:
            await server.run()
        except* Exception:
            logger.exception("a connection failed in the HTTP layer and was closed")

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            listeners = _listeners(config)
            try:
                async with trio.open_nursery() as accept_nursery:
                    accept_nursery.start_soon(
                        partial(
                            trio.serve_listeners,
                            partial(limiter.handle, serve=serve_connection),
                            listeners,
                            handler_nursery=server_nursery,
                        )
                    )
                    await shutdown_trigger()
                    accept_nursery.cancel_scope.cancel()
            finally:
                await context.terminated.set()  # idle keep-alive connections close now (as worker_serve)
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def _listeners(config: Config) -> list[trio.SocketListener]:
    listeners = []
    for sock in config.create_sockets().insecure_sockets:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        logger.info("listening on http://%s", repr_socket_addr(sock.family, sock.getsockname()))
    return listeners
