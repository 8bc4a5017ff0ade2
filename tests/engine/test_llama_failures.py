"""The real engine's failure path: which llama.cpp results lose it, and what a bug leaves behind.

llama.cpp is made to fail by replacing ``llama_decode`` with one that returns a
chosen status, as a broken device or a bad batch would; a bug is a Python
exception raised inside a generation step.  Each case then asks the engine for
another answer, which must be the one a fresh engine gives (or, for a fatal
status, a clear refusal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from bubo.domain.generation import (
    GenerationFailed,
    GenerationFinished,
    GenerationRequest,
    StopCause,
    TokenGenerated,
)
from bubo.domain.sampling import SamplingParams
from bubo.engine import _context, _sequence
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine
from bubo.errors import DeviceLost, InternalError

from .test_llama import QUESTION, prompt

pytestmark = pytest.mark.llama

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(name="engine")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    """A fresh engine per test: a fatal failure leaves it unusable."""
    engine = load_llama_engine(
        LlamaOptions(model_path=model_path, n_ctx=512, n_threads=2, n_parallel=1, prefill_chunk=64)
    )
    yield engine
    engine.close()


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
    assert isinstance(last.error, DeviceLost)
    assert engine.lost
    with pytest.raises(DeviceLost):
        await outcome(engine, request_)


async def test_a_bad_batch_fails_only_its_request(engine, request_, monkeypatch) -> None:
    """-1 (llama.cpp refused the batch) fails this request with a 500; the next is answered as before."""
    expected, _ = await outcome(engine, request_)
    failing_decode(monkeypatch, -1, after=2)
    _, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFailed)
    assert isinstance(last.error, InternalError)
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
    real_after_token: Callable[..., None] = _sequence.Sequence._after_token
    steps: list[int] = []

    def buggy_after_token(self: _sequence.Sequence, index: int) -> None:
        steps.append(index)
        if len(steps) == 3:
            raise KeyError("a bug in the third step")
        real_after_token(self, index)

    monkeypatch.setattr(_sequence.Sequence, "_after_token", buggy_after_token)
    _, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFailed)
    assert isinstance(last.error, InternalError)
    assert not engine.lost
    assert engine.statistics().slots[0].n_prompt_tokens == 0  # the half-written sequence was forgotten
    monkeypatch.undo()
    again, last = await outcome(engine, request_)
    assert isinstance(last, GenerationFinished)
    assert again == expected
