"""A generation's unread events, bounded: a client that stops reading cannot grow the server's memory.

The decode thread hands each event to trio without waiting (``engine/llama.py``),
so that it never waits for one slow client while it drives every slot.  The
events a client has not read therefore pile up in its request's channel: a
client that holds its socket open without reading would keep the whole
generation in memory, about 10 kB a token with ``n_probs`` 100 and, under
context shift with no token limit, up to the model's training context.

The backlog is counted in events against a bound set from the request's
estimated bytes an event (:func:`event_bytes`): ``--max-unread-mib``
(:data:`BACKLOG_BYTES` by default) in all, never fewer than
:data:`MIN_BACKLOG_EVENTS` events.  Past it the generation is
ended (pausing it would hold its slot and its cells for as long as the client
pleases): the consumer still reads what was sent, then :class:`StreamNotRead`,
which each dialect reports as its stream's error.  The bound is many seconds
of generation (with ``n_probs`` 100, about 1,600 tokens): a client that reads
as fast as the model writes never meets it, one that reads slower for that
long does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import trio

from bubo.domain.generation import EngineEvent

from .errors import StreamNotRead

__all__ = [
    "BACKLOG_BYTES",
    "EVENT_BYTES",
    "MIB",
    "MIN_BACKLOG_EVENTS",
    "PROBABILITY_BYTES",
    "EventBacklog",
    "backlog_limit",
    "event_bytes",
    "logprob_bytes",
]

MIB = 1024 * 1024
BACKLOG_BYTES = 16 * MIB
"""What one request's unread events may hold, estimated (a few seconds of tokens at the least)."""

MIN_BACKLOG_EVENTS = 64
"""The bound never drops below this many events, whatever each one holds."""

EVENT_BYTES = 160
"""A generated token's event as Python objects hold it (measured: 158 bytes with a short text)."""

PROBABILITY_BYTES = 100
"""Each log-probability an event carries, the token's own and each alternative (measured: 99 bytes)."""


def logprob_bytes(n_probs: int | None) -> int:
    """The estimated bytes of one token's log-probabilities with *n_probs* alternatives (None: none).

    The memory guard counts them for every token a request may generate (a
    non-streaming answer holds them all until it is sent).
    """
    return 0 if n_probs is None else (1 + n_probs) * PROBABILITY_BYTES


def event_bytes(n_probs: int | None) -> int:
    """The estimated bytes of one token's event for a request asking for *n_probs* alternatives."""
    return EVENT_BYTES + logprob_bytes(n_probs)


def backlog_limit(n_probs: int | None, budget_bytes: int = BACKLOG_BYTES) -> int:
    """How many unread events a request with *n_probs* may have before its generation is ended."""
    return max(MIN_BACKLOG_EVENTS, budget_bytes // event_bytes(n_probs))


class EventBacklog:
    """Delivers a generation's events into its channel on the trio thread, and ends it past the bound.

    *end* is called once, on the trio thread, when the unread events first
    exceed *limit*; the engine then lets go of the generation at its next step.
    """

    def __init__(
        self, send: trio.MemorySendChannel[EngineEvent], *, limit: int, end: Callable[[], None]
    ) -> None:
        self._send = send
        self.limit = limit
        self._end = end
        self.overflowed = False

    def deliver(self, event: EngineEvent) -> None:
        """Put *event* in the channel (on the trio thread); a consumer that left drops it."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            self._send.send_nowait(event)
        if not self.overflowed and self._send.statistics().current_buffer_used > self.limit:
            self.overflowed = True
            self._end()

    def error(self) -> StreamNotRead:
        """What the consumer reads after the events sent before the generation was ended."""
        return StreamNotRead(
            f"the client left more than {self.limit} events of its stream unread; the generation was ended"
        )
