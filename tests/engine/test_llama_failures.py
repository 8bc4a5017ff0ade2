"""The real engine's failure path: which llama.cpp results lose it, and what a bug leaves behind.

llama.cpp is made to fail by replacing ``llama_decode`` with one that returns a
chosen status (as a broken device or a bad batch would) or never returns (a
hung device); a bug is a Python exception raised inside a generation step or
anywhere else on the decode thread.  Each case then asks the engine for
another answer, which must be the one a fresh engine gives (or, once the
engine is lost, a clear refusal), and closes it within a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from dirty_equals import IsStr

from bubo.config import load_settings
from bubo.domain.generation import (
    GenerationFailed,
    GenerationFinished,
    GenerationRequest,
    StopCause,
    TokenGenerated,
)
from bubo.engine import EngineFailure, _context, _generation, _kv, _producer
from bubo.engine._decode_loop import DecodeLoop
from bubo.engine.errors import Cause, Lost
from bubo.engine.llama import LlamaEngine
from bubo.errors import ServiceUnavailable
from bubo.loader import load_runtime
from bubo.server import create_app

from .._llama_options import loaded_engine
from ..conftest import wait_until_ready
from ._generation import GREEDY
from ._hang import HangingCall
from .test_llama import QUESTION, prompt

pytestmark = pytest.mark.llama


@pytest.fixture(name="engine", params=["on", "off"], ids=["courier", "direct"])
def _engine(model_path: Path, request: pytest.FixtureRequest) -> Iterator[LlamaEngine]:
    """A fresh engine per test (a fatal failure leaves it unusable), its events posted each way."""
    with loaded_engine(
        model_path=model_path, n_ctx=512, n_threads=2, n_parallel=1, prefill_chunk=64, courier=request.param
    ) as engine:
        yield engine


@pytest.fixture(name="request_")
def _request(tokenizer) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt(tokenizer, QUESTION), max_new_tokens=12, sampling=GREEDY)


async def outcome(engine: LlamaEngine, request: GenerationRequest) -> tuple[str, object]:
    """The text generated and the last event (finished or failed)."""
    text, last = [], None
    with trio.fail_after(60):
        async with engine.open_generation(request) as events:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    text.append(event.text)
                last = event
    return "".join(text), last


def failing_decode(monkeypatch: pytest.MonkeyPatch, status: int, *, after: int = 0) -> list[int]:
    """Make ``llama_decode`` return *status* once, after *after* real calls; the returned list counts calls."""
    real = _context.llama_cpp.llama_decode
    calls: list[int] = []

    def decode(ctx: Any, batch: Any) -> int:
        calls.append(1)
        if len(calls) == after + 1:
            return status
        return real(ctx, batch)

    monkeypatch.setattr(_context.llama_cpp, "llama_decode", decode)
    return calls


async def test_a_compute_failure_loses_the_engine(engine, request_, monkeypatch) -> None:
    """A status below -1 (llama.cpp's compute errors) is fatal: 503 device_lost now and for later requests."""
    failing_decode(monkeypatch, -3, after=1)
    _, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFailed)
    assert isinstance(last.error, Lost)
    assert engine.lost
    with pytest.raises(Lost):
        await outcome(engine, request_)


async def test_a_bad_batch_fails_only_its_request(engine, request_, monkeypatch) -> None:
    """-1 (llama.cpp refused the batch) fails this request with a 500; the next is answered as before."""
    expected, _ = await outcome(engine, request_)
    failing_decode(monkeypatch, -1, after=2)
    _, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFailed)
    assert last.error.cause is Cause.FAILED  # a 500 engine_error
    assert not engine.lost
    monkeypatch.undo()
    again, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFinished)
    assert again == expected


async def test_no_room_mid_generation_ends_it_at_the_context(engine, request_, monkeypatch) -> None:
    """1 (no KV slot) while the only sequence generates ends it as the context's end would (``length``)."""
    expected, _ = await outcome(engine, request_)
    failing_decode(monkeypatch, 1, after=2)
    cut, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFinished)
    assert last.cause is StopCause.CONTEXT
    assert expected.startswith(cut)
    assert not engine.lost
    monkeypatch.undo()
    again, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFinished)
    assert again == expected


async def test_a_bug_mid_generation_forgets_the_sequence(engine, request_, monkeypatch) -> None:
    """An unexpected exception fails its request with a 500 and clears the slot's cache, which it may have
    left half-written; the engine stays up and the next answer equals a fresh one."""
    expected, _ = await outcome(engine, request_)
    real_next: Callable[..., int] = _generation.Generation._next
    steps: list[int] = []

    def buggy_next(self: _generation.Generation, index: int) -> int:
        steps.append(index)
        if len(steps) == 3:
            raise KeyError("a bug in the third step")
        return real_next(self, index)

    monkeypatch.setattr(_generation.Generation, "_next", buggy_next)
    _, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFailed)
    assert last.error.cause is Cause.UNEXPECTED  # a 500 internal_error: the details are only logged
    assert not engine.lost
    assert engine.statistics().slots[0].n_prompt_tokens == 0  # the half-written sequence was forgotten
    monkeypatch.undo()
    again, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFinished)
    assert again == expected


# ---- a bug on the decode thread, wherever it happens ---------------------------------------------
#
# The guard around the decode loop ends whatever the thread held (every request gets a 500),
# loses the engine (later requests get 503 device_lost) and ends the thread; nothing waits for
# ever, and closing the engine takes as long as stopping an idle thread.

DEADLINE_S = 30


def bug(*_args: object, **_kwargs: object) -> None:
    raise KeyError("a bug on the decode thread")


@pytest.fixture(name="two_slots")
def _two_slots(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(
        model_path=model_path, n_ctx=1024, n_threads=2, n_parallel=2, prefill_chunk=64
    ) as engine:
        yield engine


async def closes_cleanly(engine: LlamaEngine) -> None:
    """``aclose`` (what shutdown calls) returns within its deadline and leaves no decode thread."""
    thread = engine.current.loop._thread
    with trio.fail_after(DEADLINE_S):
        await engine.aclose()
    assert thread is None or not thread.is_alive()


async def is_lost(engine: LlamaEngine, request: GenerationRequest) -> None:
    """The engine says it is lost, and a new request is refused with 503 device_lost."""
    with trio.fail_after(DEADLINE_S):
        await engine.wait_lost()
    with pytest.raises(Lost):
        await outcome(engine, request)


def failed_with_a_500(last: object) -> None:
    assert isinstance(last, GenerationFailed)
    assert type(last.error) is EngineFailure
    assert last.error.cause is Cause.FAILED


async def generating(engine: LlamaEngine, request: GenerationRequest, nursery: trio.Nursery) -> list[object]:
    """Start *request*; return (once it has generated a token) the list its last event will be put in."""
    last: list[object] = []
    started = trio.Event()

    async def run() -> None:
        async with engine.open_generation(request) as events:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    started.set()
                last[:] = [event]

    nursery.start_soon(run)
    with trio.fail_after(DEADLINE_S):
        await started.wait()
    return last


class TestABugOnTheDecodeThread:
    async def test_in_scheduling_the_warm_up_costs_only_the_warm_up(
        self, engine, request_, monkeypatch
    ) -> None:
        """The request that just ended keeps its answer; the engine serves on and closes."""
        expected, _ = await outcome(engine, request_)
        monkeypatch.setattr(_producer, "warm_up_job", bug)
        for _ in range(2):
            text, last = await outcome(engine, attrs.evolve(request_, continuation=(1, 2)))
            assert isinstance(last, GenerationFinished)
            assert text == expected
        assert not engine.lost
        await closes_cleanly(engine)

    async def test_in_admission(self, two_slots, request_, monkeypatch) -> None:
        """The arriving request and the running one get a 500; later ones are refused; shutdown completes."""
        long = attrs.evolve(request_, max_new_tokens=400, ignore_eos=True)
        async with trio.open_nursery() as nursery:
            running = await generating(two_slots, long, nursery)
            monkeypatch.setattr(DecodeLoop, "_admit", bug)
            _, arriving = await outcome(two_slots, request_)
        failed_with_a_500(arriving)
        failed_with_a_500(running[0])
        await is_lost(two_slots, request_)
        await closes_cleanly(two_slots)

    async def test_in_a_slot_action(self, two_slots, request_, monkeypatch) -> None:
        """The slot action fails with a 500, as does the running request; the engine is lost."""
        long = attrs.evolve(request_, max_new_tokens=400, ignore_eos=True)
        async with trio.open_nursery() as nursery:
            running = await generating(two_slots, long, nursery)
            monkeypatch.setattr(DecodeLoop, "_run_call", bug)
            with pytest.raises(EngineFailure), trio.fail_after(DEADLINE_S):
                await two_slots.erase_slot(1)
        failed_with_a_500(running[0])
        await is_lost(two_slots, request_)
        await closes_cleanly(two_slots)

    async def test_in_idle_work(self, engine, request_, monkeypatch) -> None:
        """The answer before the warm-up is whole; the engine is lost once the warm-up fails."""
        monkeypatch.setattr(DecodeLoop, "_run_idle", bug)
        _, last = await outcome(engine, attrs.evolve(request_, continuation=(1, 2)))
        assert isinstance(last, GenerationFinished)
        with trio.fail_after(DEADLINE_S):
            await engine.settle()
        await is_lost(engine, request_)
        await closes_cleanly(engine)

    async def test_in_the_handler_of_a_failed_step(self, engine, request_, monkeypatch) -> None:
        """A step fails, then so does what handles that: the request gets a 500, the engine is lost."""
        monkeypatch.setattr(DecodeLoop, "_step", bug)
        monkeypatch.setattr(DecodeLoop, "_step_failed", bug)
        _, last = await outcome(engine, request_)
        failed_with_a_500(last)
        assert engine.lost  # trio heard of the loss (posted directly) before the end (by the courier or not)
        await is_lost(engine, request_)
        await closes_cleanly(engine)


class TestAStuckDecodeThread:
    async def test_a_request_it_does_not_let_go_of_fails_and_the_engine_is_lost(
        self, engine, request_, monkeypatch
    ) -> None:
        """Interrupted (shutdown's deadline) while ``llama_decode`` hangs, the request fails with a 500
        within the bound instead of holding its slot for good; closing leaves the context to the stuck
        thread rather than freeing it under it."""
        engine.release_wait_s = 0.5
        real = _context.llama_cpp.llama_decode
        calls: list[int] = []
        stuck, release = threading.Event(), threading.Event()

        def hanging_decode(ctx: Any, batch: Any) -> int:
            calls.append(1)
            if len(calls) == 4:
                stuck.set()
                release.wait()
            return real(ctx, batch)

        monkeypatch.setattr(_context.llama_cpp, "llama_decode", hanging_decode)
        thread = None
        try:
            async with trio.open_nursery() as nursery:
                running = await generating(engine, request_, nursery)
                await trio.to_thread.run_sync(stuck.wait, DEADLINE_S)
                thread = engine.current.loop._thread
                engine.interrupt(ServiceUnavailable("the server is shutting down", code="not_ready"))
            failed_with_a_500(running[0])
            assert engine.lost
            with trio.fail_after(DEADLINE_S):
                await engine.aclose()  # returns: the thread did not stop, the context is left to it
            assert thread is not None
            assert thread.is_alive()
        finally:
            release.set()
        assert thread is not None
        await trio.to_thread.run_sync(thread.join, DEADLINE_S)
        assert not thread.is_alive()

    async def test_a_slot_file_call_that_hangs_fails_at_its_bound_and_frees_the_request_beside_it(
        self, two_slots, request_, monkeypatch, mock_clock, tmp_path
    ) -> None:
        """``llama_state_seq_save_file`` never returns (a hung disk): at the action's bound the save fails
        with a 500 and the engine is lost; the request generating beside it, whose steps the stuck thread
        no longer runs, gets 503 device_lost then rather than when its client gives up; shutdown completes
        with the call still hung."""
        two_slots.release_wait_s = 0.5  # close() joins the stuck thread this long (real time), then leaves it
        long = attrs.evolve(request_, max_new_tokens=400, ignore_eos=True, slot=0)
        failures: list[EngineFailure] = []
        saved = threading.Event()

        async def save() -> None:
            try:
                with pytest.raises(EngineFailure) as failed:
                    await two_slots.save_slot(1, tmp_path / "one.bin")
                failures.append(failed.value)
            finally:
                saved.set()

        thread = None
        with HangingCall(result=0) as file_call:
            monkeypatch.setattr(_kv.llama_cpp, "llama_state_seq_save_file", lambda *_args: file_call())
            async with trio.open_nursery() as nursery:
                running = await generating(two_slots, long, nursery)
                nursery.start_soon(save)
                await file_call.wait_stuck()
                thread = two_slots.current.loop._thread
                mock_clock.jump(two_slots.slot_action_wait_s)
                assert await trio.to_thread.run_sync(saved.wait, DEADLINE_S)  # no more trio time passes
            assert failures[0].fatal
            assert failures[0].cause is Cause.FAILED
            assert isinstance(running[0], GenerationFailed)
            assert type(running[0].error) is Lost
            await is_lost(two_slots, request_)
            await two_slots.aclose()  # returns: the thread did not stop, the context is left to it
            assert thread is not None
            assert thread.is_alive()
        await trio.to_thread.run_sync(thread.join, DEADLINE_S)
        assert not thread.is_alive()


async def test_over_http_a_bug_is_a_500_in_the_dialects_shape_and_health_says_lost(monkeypatch) -> None:
    """Through the real app: the request that met the bug gets a 500 in its dialect's envelope, /health and
    /ready say device_lost, later requests get a 503, and the app's shutdown (the lifespan's end) completes."""
    settings = load_settings({"model__ctx_size": "512", "model__threads": "2"}, environ={})
    runtime = load_runtime(settings, lambda _: None)
    app = create_app(settings, load=lambda _settings, _progress: runtime, on_load_failure=lambda: None)
    chat = {"model": "bubo", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    try:
        with trio.fail_after(DEADLINE_S):
            async with app.test_app() as test_app:
                await wait_until_ready(app)
                client = test_app.test_client()
                monkeypatch.setattr(DecodeLoop, "_admit", bug)
                response = await client.post("/v1/chat/completions", json=chat)
                assert response.status_code == 500
                assert (await response.get_json())["error"] == {
                    "message": IsStr,
                    "type": "server_error",
                    "param": None,
                    "code": "engine_error",
                }
                health = await client.get("/health")
                assert (health.status_code, await health.get_json()) == (503, {"status": "device_lost"})
                ready = await client.get("/ready")
                assert (ready.status_code, (await ready.get_json())["status"]) == (503, "device_lost")
                refused = await client.post("/v1/messages", json=chat)
                assert refused.status_code == 503
                assert (await refused.get_json())["error"]["type"] == "overloaded_error"
    finally:
        runtime.engine.close()
