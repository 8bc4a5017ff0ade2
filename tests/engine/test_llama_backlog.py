"""The llama.cpp engine ends a generation whose client leaves its events unread past the bound (issue 36 §3).

The decode thread never waits for a client; before, a client that stopped
reading let a whole generation's events (10 kB a token with ``n_probs`` 100)
pile up in its channel.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
from bubo.engine import StreamNotRead
from bubo.engine._backlog import MIN_BACKLOG_EVENTS
from bubo.engine.llama import LlamaEngine
from bubo.tokenizer import HFTokenizer

from .._llama_options import loaded_engine

pytestmark = pytest.mark.llama

STORY = "<|im_start|>user\nWrite a long story.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(name="engine", scope="module")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(model_path=model_path, n_ctx=1024, n_threads=2) as engine:
        engine.backlog_bytes = 1  # the floor: MIN_BACKLOG_EVENTS events
        yield engine


async def test_a_stream_left_unread_is_ended_past_its_bound(
    engine: LlamaEngine, tokenizer: HFTokenizer
) -> None:
    """Nothing is read until the producer is done: it stopped at the bound, well before its 900 tokens."""
    request = GenerationRequest(
        prompt_tokens=tuple(tokenizer.encode(STORY)), max_new_tokens=900, ignore_eos=True, n_probs=100
    )
    async with engine.open_generation(request) as events:
        with trio.fail_after(300):
            while events.statistics().open_send_channels:  # the producer closes its end when it is done
                await trio.sleep(0.05)
        received = [event async for event in events]
    tokens = [event for event in received if isinstance(event, TokenGenerated)]
    assert MIN_BACKLOG_EVENTS - 2 <= len(tokens) <= MIN_BACKLOG_EVENTS + 8  # one step's more at most
    assert all(token.logprob is not None and len(token.logprob.top) == 100 for token in tokens)
    assert isinstance(received[-1], GenerationFailed)
    assert isinstance(received[-1].error, StreamNotRead)
    assert engine.statistics().requests_processing == 0


async def test_the_slot_serves_the_next_request(engine: LlamaEngine, tokenizer: HFTokenizer) -> None:
    """After a generation ended so, the next one (read as it comes) runs to its limit."""
    request = GenerationRequest(
        prompt_tokens=tuple(tokenizer.encode(STORY)),
        max_new_tokens=16,
        ignore_eos=True,
        n_probs=100,
        sampling=SamplingParams(temperature=0.0),
    )
    finished = None
    count = 0
    async with engine.open_generation(request) as events:
        async for event in events:
            count += isinstance(event, TokenGenerated)
            if isinstance(event, GenerationFinished):
                finished = event
    assert finished is not None
    assert (finished.cause, count) == (StopCause.LIMIT, 16)
