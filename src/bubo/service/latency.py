"""One request's latency, as its client lives it: queue wait, first token, the gaps between tokens, the end.

Every generation of every dialect, streaming or not, passes through
:func:`bubo.service.generation.open_output`, so that is where a
:class:`RequestTimeline` is read, on trio's clock (monotonic, and a test's
``MockClock``).  Each figure goes to a :class:`LatencyObserver` as it
happens; the API layer's Prometheus histograms are the one in use.

* queue wait: from asking the engine for a slot to holding one;
* time to first token: from the request's arrival (before its body was
  parsed and its prompt rendered) to the first generated token, so it holds
  the preparation, the queue wait and the prompt's evaluation;
* inter-token latency: each gap between two consecutive tokens of the request;
* request duration: from arrival until the generation finished, failed or
  the client left, by :class:`Outcome`.

Times are taken when the request's handler receives each engine event: for
a stream, after the previous event's frame was handed to the server, which is
the latency the client sees.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from typing import Protocol

import attrs
import trio

from bubo.domain.generation import EngineEvent, GenerationFailed, GenerationFinished, TokenGenerated

__all__ = ["LatencyObserver", "Outcome", "RequestTimeline"]


class Outcome(enum.Enum):
    """How a request that reached the queue ended."""

    FINISHED = "finished"  # the engine finished it (any stop: end of text, limit, stop word)
    CANCELLED = "cancelled"  # it was left before the end: the client went away (waiting or generating)
    FAILED = "failed"  # an error ended it: engine failure, lost device, shutdown


class LatencyObserver(Protocol):
    """Where a request's latencies go, in seconds."""

    def observe_queue_wait(self, seconds: float) -> None:
        """A request got the slot after waiting *seconds*."""
        ...

    def observe_time_to_first_token(self, seconds: float) -> None:
        """A request's first token came *seconds* after its arrival."""
        ...

    def observe_inter_token(self, seconds: float) -> None:
        """A token came *seconds* after the request's previous one."""
        ...

    def observe_request(self, seconds: float, outcome: Outcome) -> None:
        """A request ended, *seconds* after its arrival."""
        ...


@attrs.define
class RequestTimeline:
    """One request's timeline; reports to *observer* as the request goes."""

    observer: LatencyObserver
    received: float  # trio.current_time() when the server began handling the request
    _last_token: float | None = attrs.field(default=None, init=False)
    _outcome: Outcome = attrs.field(default=Outcome.CANCELLED, init=False)

    def slot_held(self, asked: float) -> None:
        """The request holds a slot now; it asked for one at *asked*."""
        self.observer.observe_queue_wait(trio.current_time() - asked)

    def saw(self, event: EngineEvent) -> None:
        """The request's handler received *event* from the engine just now."""
        match event:
            case TokenGenerated():
                now = trio.current_time()
                if self._last_token is None:
                    self.observer.observe_time_to_first_token(now - self.received)
                else:
                    self.observer.observe_inter_token(now - self._last_token)
                self._last_token = now
            case GenerationFinished():
                self._outcome = Outcome.FINISHED
            case GenerationFailed():
                self._outcome = Outcome.FAILED

    def failed(self) -> None:
        """An error ended the request (unless the engine had finished it already)."""
        if self._outcome is not Outcome.FINISHED:
            self._outcome = Outcome.FAILED

    def ended(self) -> None:
        """The request is over: finished, failed, or left (the outcome it had until now)."""
        self.observer.observe_request(trio.current_time() - self.received, self._outcome)

    def watch(self, events: AsyncIterator[EngineEvent]) -> AsyncIterator[EngineEvent]:
        """*events*, each noted by :meth:`saw` as the handler receives it."""
        return _Watched(events, self)


class _Watched:
    """An engine event stream that reports each event to a timeline (a plain iterator: nothing to close)."""

    def __init__(self, events: AsyncIterator[EngineEvent], timeline: RequestTimeline) -> None:
        self._events = events
        self._timeline = timeline

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> EngineEvent:
        event = await anext(self._events)
        self._timeline.saw(event)
        return event
