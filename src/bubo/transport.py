"""``bubo serve``'s listener: Hypercorn's HTTP protocol under Bubo's own accept loop.

``hypercorn.trio.serve`` accepts every connection and runs each in the
server's own nursery, so it has no answer to two things a public server needs:

- **A cap on open connections.**  Each one holds a file descriptor; once the
  process runs out, nobody can connect, ``/health`` included.  Here at most
  ``max_connections`` are served (kept below the descriptor limit, which is
  raised toward its hard limit at start); the excess gets a plain 503
  ``too_many_connections`` and is closed.
- **One connection's failure stays its own.**  An exception in Hypercorn's
  protocol code (its HTTP/2 handling has raised ``KeyError`` on a client's
  stray frame, see ``api/_transport.py``) would end ``serve()`` and the
  process; here it is logged and only that connection is closed.

The rest is Hypercorn's ``worker_serve`` (0.18) for a plain-TCP worker: the
ASGI lifespan around serving, and at shutdown idle connections told to close
and ``graceful_timeout`` for the rest.  Each connection is still Hypercorn's
``TCPServer`` (HTTP/1.1, h2c, keep-alive timeout).  Under
``hypercorn bubo.app:app`` none of this applies: Hypercorn runs its own loop.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Awaitable, Callable
from functools import partial

import attrs
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr

from bubo.api._transport import error_body
from bubo.errors import ServiceUnavailable

__all__ = ["FD_RESERVE", "ConnectionLimiter", "raise_open_file_limit", "serve"]

logger = logging.getLogger(__name__)

# Descriptors kept out of the connection cap: the process's own (model file, log, epoll,
# thread wake-ups: about 20 when serving) and refusals in flight (REFUSALS_AT_ONCE).
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


@attrs.define
class ConnectionLimiter:
    """At most *cap* connections served; the excess refused with a 503 and closed."""

    cap: int
    _served: trio.CapacityLimiter = attrs.field(init=False)
    _refusing: trio.CapacityLimiter = attrs.field(init=False)
    _warned: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._served = trio.CapacityLimiter(self.cap)
        self._refusing = trio.CapacityLimiter(REFUSALS_AT_ONCE)

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
        return int(self._served.borrowed_tokens)

    async def handle(
        self, stream: trio.SocketStream, serve: Callable[[trio.SocketStream], Awaitable[None]]
    ) -> None:
        """Serve *stream* within the cap, or refuse it."""
        try:
            self._served.acquire_on_behalf_of_nowait(stream)
        except trio.WouldBlock:
            await self._refuse(stream)
            return
        try:
            await serve(stream)
        finally:
            self._served.release_on_behalf_of(stream)
            if self._served.available_tokens > 0:
                self._warned = False

    async def _refuse(self, stream: trio.SocketStream) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "%d connections open (--max-connections): new connections get 503 until some close", self.cap
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
    wrapped = ASGIWrapper(app)
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)

    async def serve_connection(stream: trio.SocketStream) -> None:
        server = TCPServer(wrapped, config, context, ConnectionState(lifespan_state.copy()), stream)
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
                await context.terminated.set()  # idle keep-alive connections close now
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
