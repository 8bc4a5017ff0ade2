"""Which failures lose the engine: only fatal engine errors, whether in a request or in idle work."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from bubo.domain.generation import GenerationFailed, GenerationFinished, GenerationRequest
from bubo.engine import EngineFailure
from bubo.engine._courier import DirectPost
from bubo.engine._decode_loop import DecodeLoop
from bubo.engine._prefill_budget import PrefillBudget
from bubo.engine.errors import Lost, Unexpected
from bubo.engine.fake import FakeEngine

REQUEST = GenerationRequest(prompt_tokens=(1, 2, 3), max_new_tokens=4)


class Exploding(FakeEngine):
    """A fake engine whose next generation raises *error*."""

    error: Exception | None = None

    async def _produce(self, slot, request, send) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        await super()._produce(slot, request, send)


async def last_event(engine: FakeEngine) -> object:
    async with engine.open_generation(REQUEST) as events:
        return [event async for event in events][-1]


async def test_a_bug_fails_only_its_own_request() -> None:
    engine = Exploding()
    engine.error = KeyError("a bug")
    failed = await last_event(engine)
    assert isinstance(failed, GenerationFailed)
    assert type(failed.error) is Unexpected
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
    assert isinstance(failed.error, Lost)
    assert engine.lost
    with pytest.raises(Lost):
        await last_event(engine)


@pytest.mark.parametrize("fatal", [False, True])
def test_idle_work_failures(fatal: bool) -> None:
    """A failed warm-up leaves the next turn cold; a fatal one loses the engine and refuses later sequences."""
    lost: list[EngineFailure] = []
    context = SimpleNamespace(n_batch=8, caches=())
    loop = DecodeLoop(
        context,
        prefill=PrefillBudget(fixed=8, n_batch=context.n_batch),
        drafting=None,
        to_trio=DirectPost(),
        on_lost=lost.append,
    )  # type: ignore[arg-type]
    failure = EngineFailure("warm-up decode failed", fatal=fatal)
    ran_after = threading.Event()

    def failing_job() -> None:
        raise failure

    loop.schedule_idle(failing_job)
    loop.schedule_idle(ran_after.set)
    try:
        assert ran_after.wait(timeout=5)
        assert lost == ([failure] if fatal else [])
        if fatal:  # a sequence that arrives later is refused with the failure, never decoded
            ended: list[BaseException | None] = []
            done = threading.Event()
            sequence = SimpleNamespace(cancelled=False)
            loop.submit(sequence, lambda error: (ended.append(error), done.set()))  # type: ignore[arg-type]
            assert done.wait(timeout=5)
            assert ended == [failure]
    finally:
        loop.stop()
