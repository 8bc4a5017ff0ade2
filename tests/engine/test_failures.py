"""Which failures lose the engine: only fatal engine errors, whether in a request or in idle work."""

from __future__ import annotations

import pytest
import trio

from bubo.domain.generation import GenerationFailed, GenerationFinished, GenerationRequest
from bubo.engine import EngineFailure
from bubo.engine.fake import FakeEngine
from bubo.errors import DeviceLost, InternalError

REQUEST = GenerationRequest(prompt_tokens=(1, 2, 3), max_new_tokens=4)


class Exploding(FakeEngine):
    """A fake engine whose next generation raises *error*."""

    error: Exception | None = None

    async def _produce(self, request, send) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        await super()._produce(request, send)


async def last_event(engine: FakeEngine) -> object:
    async with engine.open_generation(REQUEST) as events:
        return [event async for event in events][-1]


async def test_a_bug_fails_only_its_own_request() -> None:
    engine = Exploding()
    engine.error = KeyError("a bug")
    failed = await last_event(engine)
    assert isinstance(failed, GenerationFailed)
    assert type(failed.error) is InternalError
    assert not engine.lost
    assert isinstance(await last_event(engine), GenerationFinished)


async def test_a_recoverable_engine_failure_fails_only_its_own_request() -> None:
    engine = Exploding()
    engine.error = EngineFailure("llama_decode failed with status 1")
    failed = await last_event(engine)
    assert isinstance(failed, GenerationFailed)
    assert failed.error.code == "engine_error"
    assert not engine.lost


async def test_a_fatal_engine_failure_loses_the_engine() -> None:
    engine = Exploding()
    engine.error = EngineFailure("llama_decode failed with status -3", fatal=True)
    failed = await last_event(engine)
    assert isinstance(failed, GenerationFailed)
    assert isinstance(failed.error, DeviceLost)
    assert engine.lost
    with pytest.raises(DeviceLost):
        await last_event(engine)


@pytest.mark.parametrize("fatal", [False, True])
async def test_idle_work_failures(fatal: bool) -> None:
    """A failed warm-up leaves the next turn cold; a fatal one, raised in the worker thread, loses the engine."""
    engine = FakeEngine()
    ran_after: list[str] = []

    def failing_job() -> None:
        raise EngineFailure("warm-up decode failed", fatal=fatal)

    engine._schedule_idle(failing_job)
    engine._schedule_idle(lambda: ran_after.append("next job"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(engine.run_idle_work)
        if fatal:
            with trio.fail_after(5):
                await engine.wait_lost()
        else:
            with trio.fail_after(5):
                while not ran_after:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert engine.lost is fatal
    assert ran_after == ([] if fatal else ["next job"])
