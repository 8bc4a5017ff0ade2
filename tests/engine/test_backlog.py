"""A generation's unread events are bounded: past the bound it is ended (issue 36 §3)."""

from __future__ import annotations

import trio

from bubo.domain.generation import EngineEvent, PromptProgress, TokenGenerated
from bubo.engine._backlog import (
    BACKLOG_BYTES,
    MIN_BACKLOG_EVENTS,
    EventBacklog,
    backlog_limit,
    event_bytes,
)
from bubo.engine.errors import Cause, StreamNotRead


def token(index: int) -> TokenGenerated:
    return TokenGenerated(token_id=index, text=f"t{index}")


class TestLimit:
    def test_the_bound_is_in_bytes_of_the_requests_events(self) -> None:
        """n_probs 100 makes each event about 64 times larger: the bound holds that many fewer."""
        plain, probs = backlog_limit(None), backlog_limit(100)
        assert plain * event_bytes(None) <= BACKLOG_BYTES
        assert probs * event_bytes(100) <= BACKLOG_BYTES
        assert plain > 50 * probs >= 50 * MIN_BACKLOG_EVENTS

    def test_never_fewer_than_the_floor(self) -> None:
        assert backlog_limit(100, budget_bytes=1) == MIN_BACKLOG_EVENTS


class TestEventBacklog:
    async def test_ended_once_past_the_bound_and_everything_sent_is_read(self) -> None:
        send, receive = trio.open_memory_channel[EngineEvent](float("inf"))
        ended: list[int] = []
        backlog = EventBacklog(send, limit=3, end=lambda: ended.append(1))
        for index in range(3):
            backlog.deliver(token(index))
        assert not backlog.overflowed
        backlog.deliver(token(3))
        backlog.deliver(token(4))  # the thread may emit a step's events more before it lets go
        assert backlog.overflowed
        assert ended == [1]
        assert [receive.receive_nowait().token_id for _ in range(5)] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
        assert isinstance(backlog.error(), StreamNotRead)
        assert backlog.error().cause is Cause.STREAM_NOT_READ
        assert "3 events" in backlog.error().message

    async def test_a_reading_client_never_meets_the_bound(self) -> None:
        send, receive = trio.open_memory_channel[EngineEvent](float("inf"))
        backlog = EventBacklog(send, limit=2, end=lambda: None)
        for index in range(100):
            backlog.deliver(PromptProgress(total=100, cached=0, processed=index, elapsed_ms=0.0))
            backlog.deliver(token(index))
            receive.receive_nowait()
            receive.receive_nowait()
        assert not backlog.overflowed

    async def test_a_consumer_that_left_drops_the_events(self) -> None:
        send, receive = trio.open_memory_channel[EngineEvent](float("inf"))
        backlog = EventBacklog(send, limit=1, end=lambda: None)
        receive.close()
        for index in range(5):
            backlog.deliver(token(index))
        assert not backlog.overflowed
