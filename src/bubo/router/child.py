"""The child's side of the router's contract: its listening socket, and stop when the router is gone.

The router binds each child's loopback socket itself and hands it over open
(its descriptor in :data:`LISTEN_FD_ENV`), so the port is never free between
the router choosing it and the child listening on it: no other local process
can take the port in between and receive the child's key and the prompts the
router sends there.  The router keeps its own copy open until it has seen the
child exit, so the port stays taken for as long as the router may send to it.

The router starts each child with a pipe as its standard input that it never
writes to and keeps open while it lives; when the router exits, however it
exits (SIGKILL included), the kernel closes the pipe and the child reads end
of file.  A ``bubo serve`` started with :data:`ROUTER_CHILD_ENV` set then
drains and stops, as on SIGTERM, so no child outlives its router (llama-server's
children watch their standard input the same way).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import trio

from bubo.config import ConfigError

__all__ = ["LISTEN_FD_ENV", "ROUTER_CHILD_ENV", "inherited_listener", "is_router_child", "router_gone"]

ROUTER_CHILD_ENV = "BUBO_ROUTER_CHILD"
LISTEN_FD_ENV = "BUBO_ROUTER_LISTEN_FD"


def is_router_child(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by a router (and should stop when it is gone)."""
    return (os.environ if environ is None else environ).get(ROUTER_CHILD_ENV) == "1"


def inherited_listener(environ: Mapping[str, str] | None = None) -> int | None:
    """The descriptor of the listening socket a router handed this child; None when not a router's child.

    Raises:
        ConfigError: a router's child without a socket's descriptor (it must not bind a port itself).

    """
    environ = os.environ if environ is None else environ
    if not is_router_child(environ):
        return None
    text = environ.get(LISTEN_FD_ENV, "")
    if not text.isdecimal():
        raise ConfigError(
            f"{LISTEN_FD_ENV} must be the descriptor of the socket the router bound, got {text!r}"
        )
    return int(text)


async def router_gone() -> None:
    """Return once standard input reaches end of file: the router has exited."""
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stream:
        while await stream.receive_some():
            pass
