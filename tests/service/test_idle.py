"""When the idle model is freed, on trio's mock clock (autojump: no real waiting, no race with a busy machine).

The engine here is a stand-in that only records when it is asked to sleep;
what sleeping does is tested in tests/engine/test_sleep.py.
"""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from bubo.service.idle import IdleSleeper


@attrs.define
class IdleEngine:
    """Idle since time 0; ``sleep`` succeeds and is recorded on the clock."""

    in_use: bool = False
    idle_since: float = 0.0
    sleeping: bool = False
    slept_at: list[float] = attrs.field(factory=list)

    async def sleep(self) -> bool:
        self.sleeping = True
        self.slept_at.append(trio.current_time())
        return True

    async def wait_activity(self) -> None:
        await trio.sleep_forever()


async def run_for(sleeper: IdleSleeper, engine: IdleEngine, seconds: float) -> None:
    """Run the sleeper for *seconds* of trio's clock, then stop it."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper.run, engine)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_the_server_timeout_frees_the_model_when_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = IdleEngine()
    await run_for(IdleSleeper(idle_s=1.0), engine, 3600)
    assert engine.slept_at == [pytest.approx(1.0)]


async def test_no_timeout_never_frees_it(autojump_clock: trio.testing.MockClock) -> None:
    engine = IdleEngine()
    await run_for(IdleSleeper(idle_s=None), engine, 10 * 86400)
    assert engine.slept_at == []


async def test_a_clients_keep_alive_outlasts_the_server_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = IdleEngine()
    sleeper = IdleSleeper(idle_s=1.0)
    sleeper.keep_alive(600.0)  # Ollama's keep_alive "10m"
    await run_for(sleeper, engine, 3600)
    assert engine.slept_at == [pytest.approx(600.0)]


async def test_ignore_keeps_the_server_timeout(autojump_clock: trio.testing.MockClock) -> None:
    engine = IdleEngine()
    sleeper = IdleSleeper(idle_s=1.0, policy="ignore")
    sleeper.keep_alive(600.0)
    await run_for(sleeper, engine, 3600)
    assert engine.slept_at == [pytest.approx(1.0)]
