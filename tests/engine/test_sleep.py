"""Sleeping while idle: the engine frees its model when nothing holds it and loads it for the next request.

The state machine (:class:`Wakefulness`) with blocking stand-ins for freeing and loading, then the
real engine on the default model (SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from bubo.domain.generation import GenerationRequest
from bubo.engine._sleep import Wakefulness, WakeState
from bubo.engine.errors import Cause, Unloaded, Waking
from bubo.engine.llama import load_llama_engine
from bubo.tokenizer import HFTokenizer

from .._llama_options import engine_options
from ._generation import GREEDY
from .test_llama import prompt, run


class Model:
    """Freeing and loading that block until the test lets them go."""

    def __init__(self) -> None:
        self.loads = 0
        self.frees = 0
        self.gate = threading.Event()
        self.gate.set()

    def free(self) -> None:
        self.gate.wait(10)
        self.frees += 1

    def load(self) -> None:
        self.gate.wait(10)
        self.loads += 1


def wakefulness(model: Model, *, wake_wait_s: float = 10.0) -> Wakefulness:
    return Wakefulness(fall_asleep=model.free, wake_up=model.load, on_failure=lambda _reason: None,
                       wake_wait_s=wake_wait_s)  # fmt: skip


class TestWakefulness:
    async def test_it_sleeps_only_while_nothing_holds_it(self) -> None:
        model = Model()
        awake = wakefulness(model)
        async with awake.held():
            assert await awake.sleep() is False
        assert await awake.sleep() is True
        assert (awake.state, model.frees, awake.sleeps) == (WakeState.ASLEEP, 1, 1)

    async def test_requests_during_the_reload_wait_for_it_and_share_it(self) -> None:
        model = Model()
        awake = wakefulness(model)
        await awake.sleep()
        model.gate.clear()
        served = []

        async def request(n: int) -> None:
            async with awake.held():
                served.append((n, awake.state))

        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(request, n)
            await trio.testing.wait_all_tasks_blocked()  # each request has reached its wait
            assert served == []
            assert awake.state is WakeState.WAKING
            model.gate.set()
        assert sorted(served) == [(n, WakeState.AWAKE) for n in range(3)]
        assert model.loads == 1

    async def test_a_request_arriving_while_it_falls_asleep_wakes_it_after(self) -> None:
        model = Model()
        awake = wakefulness(model)
        model.gate.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(awake.sleep)
            await trio.testing.wait_all_tasks_blocked()  # freeing has begun (in its thread)
            assert awake.state is WakeState.FALLING_ASLEEP
            trio.lowlevel.current_trio_token().run_sync_soon(model.gate.set)
            async with awake.held():
                assert awake.state is WakeState.AWAKE
        assert (model.frees, model.loads) == (1, 1)

    async def test_the_wait_for_a_reload_is_bounded(self) -> None:
        model = Model()
        awake = wakefulness(model, wake_wait_s=0.2)
        await awake.sleep()
        model.gate.clear()
        with pytest.raises(Waking) as refused:
            async with awake.held():
                pass
        assert refused.value.code == "model_waking"
        assert refused.value.cause is Cause.WAKING  # the API answers 503 with Retry-After
        model.gate.set()
        async with awake.held():  # the reload went on without the request that left
            assert model.loads == 1

    async def test_a_reload_that_fails_loses_the_engine(self) -> None:
        reasons: list[str] = []

        def broken() -> None:
            raise OSError("the model file is gone")

        awake = Wakefulness(fall_asleep=lambda: None, wake_up=broken, on_failure=reasons.append)
        await awake.sleep()
        with pytest.raises(Unloaded, match="could not be loaded again"):
            async with awake.held():
                pass
        assert reasons == ["waking: the model file is gone"]


@pytest.mark.llama
class TestLlamaEngine:
    async def test_it_frees_the_model_and_answers_the_same_after_loading_it_again(
        self, model_path: Path, tokenizer: HFTokenizer
    ) -> None:
        engine = load_llama_engine(
            engine_options(model_path=model_path, n_ctx=1024, n_threads=2, n_parallel=1, embeddings=True)
        )
        try:
            request = GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=8, sampling=GREEDY)
            _, before, _ = await run(engine, request)
            tokens = prompt(tokenizer, "a sentence to embed")
            async with engine.awake():
                assert engine.embedder is not None
                vector = engine.embedder.embed(tokens)

            assert await engine.sleep() is True
            assert engine.sleeping
            assert engine.statistics().slots[0].n_prompt_tokens == 0
            assert engine.embedder is not None  # still served: it opens again with the model

            _, after, finished = await run(engine, request)
            assert [t.token_id for t in after] == [t.token_id for t in before]
            assert finished.stats.cached_tokens == 0  # the prompt cache went with the context
            assert not engine.sleeping
            assert engine.sleeps == 1
            async with engine.awake():
                assert np.array_equal(engine.embedder.embed(tokens), vector)
        finally:
            engine.close()
