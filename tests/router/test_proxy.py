"""The router's proxied body: a client that stops reading stops the reading from the child."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import trio
import trio.testing

from bubo.errors import BuboError, ServiceUnavailable
from bubo.router.proxy import ProxiedBody

CHUNKS = 1000


class CountingStream(httpx.AsyncByteStream):
    """A child's response body of CHUNKS events, counting those the router has read."""

    def __init__(self) -> None:
        self.read = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for n in range(CHUNKS):
            await trio.lowlevel.checkpoint()  # as a read from the network would
            if self.closed:
                raise httpx.ReadError("closed")  # as a read from a closed connection does
            self.read += 1
            yield f'data: {{"n": {n}}}\n\n'.encode()

    async def aclose(self) -> None:
        self.closed = True


async def failure() -> BuboError:
    return ServiceUnavailable("the child stopped")


async def test_a_client_that_stops_reading_holds_the_child_s_stream_back() -> None:
    """The router reads one chunk ahead of its client at most, never the whole generation."""
    stream = CountingStream()
    upstream = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)
    async with ProxiedBody(upstream, failure=failure, error_frame=None) as body:
        first = await body.__anext__()
        assert first == b'data: {"n": 0}\n\n'
        await trio.testing.wait_all_tasks_blocked()  # the reader went as far as it could
        assert stream.read <= 2  # the chunk the client took and the one waiting
        rest = [chunk async for chunk in body]
    assert len(rest) == CHUNKS - 1
    assert stream.read == CHUNKS


async def test_a_client_that_leaves_while_the_reader_waits_closes_the_child_s_stream() -> None:
    """Leaving the body cancels the reader blocked on the client and closes the child's response."""
    stream = CountingStream()
    upstream = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)
    with trio.fail_after(5):  # a reader that cannot be cancelled would hang here
        async with ProxiedBody(upstream, failure=failure, error_frame=None) as body:
            await body.__anext__()
            await trio.testing.wait_all_tasks_blocked()
    assert stream.closed
    assert stream.read < CHUNKS
