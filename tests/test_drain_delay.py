"""``bubo serve``'s answer to SIGTERM: ``--drain-delay`` seconds unready but serving, then the drain.

The e2e side (a real ``bubo serve`` answering requests during the delay) is in
tests/e2e/test_operations.py; here the order and the length of the two phases,
on trio's mock clock.
"""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.testing

from bubo.cli import until_drain_begins
from bubo.config import load_settings


@pytest.mark.parametrize("delay", [7.0, 0.0])
async def test_the_signal_turns_readiness_off_for_the_delay_before_the_drain(
    autojump_clock: trio.testing.MockClock, delay: float
) -> None:
    settings = load_settings({"server__drain_delay": str(delay)}, environ={})
    events: list[tuple[str, float]] = []

    async def wait_then_drain() -> None:
        await until_drain_begins(settings, lambda: events.append(("unready", trio.current_time())))
        events.append(("drain", trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_then_drain)
        await trio.testing.wait_all_tasks_blocked()
        assert events == []  # nothing happens before the signal
        os.kill(os.getpid(), signal.SIGTERM)
    if delay:
        assert [name for name, _ in events] == ["unready", "drain"]
        assert events[1][1] - events[0][1] == delay
    else:  # no delay: readiness is not turned off separately, the drain refuses at once
        assert [name for name, _ in events] == ["drain"]
