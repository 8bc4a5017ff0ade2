"""The child's side of the router's contract: stop when the router is gone.

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

import trio

__all__ = ["ROUTER_CHILD_ENV", "is_router_child", "router_gone"]

ROUTER_CHILD_ENV = "BUBO_ROUTER_CHILD"


def is_router_child() -> bool:
    """Whether this process was started by a router (and should stop when it is gone)."""
    return os.environ.get(ROUTER_CHILD_ENV) == "1"


async def router_gone() -> None:
    """Return once standard input reaches end of file: the router has exited."""
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stream:
        while await stream.receive_some():
            pass
