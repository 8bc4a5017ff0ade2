"""Parallel slots on the real engine: batched sequences, chunked prefill, leaving, a full shared context.

The module's engine gives each slot a KV cache of its own (``kv_unified=False``):
then a sequence's numbers do not depend on what else is in its batch, and
greedy outputs equal those of each prompt alone, token for token.  With the
unified cache (the default) llama.cpp attends over every slot's cells with a
mask, and the result depends slightly on the batch: measured on the default
model, log-probabilities differed by up to 0.13 and two of four greedy
continuations took another near-tied token after 16 to 23 tokens
(docs/performance.md, "Parallel slots").
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
    PromptProgress,
    StopCause,
    TokenGenerated,
)
from bubo.engine.llama import LlamaEngine, load_llama_engine
from bubo.tokenizer import HFTokenizer

from .._llama_options import engine_options, loaded_engine
from ._generation import GREEDY

pytestmark = pytest.mark.llama

TOPICS = ("whales", "volcanoes", "glaciers", "tides")


def question(tokenizer: HFTokenizer, topic: str, repeat: int = 1) -> tuple[int, ...]:
    text = f"<|im_start|>user\nTell me about {topic}. " + "Please be thorough. " * repeat
    return tuple(tokenizer.encode(text + "<|im_end|>\n<|im_start|>assistant\n"))


@pytest.fixture(name="engine", scope="module")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(
        model_path=model_path, n_ctx=1024, n_threads=2, n_parallel=4, prefill_chunk=64, kv_unified=False
    ) as engine:
        yield engine


async def collect(
    engine: LlamaEngine,
    request: GenerationRequest,
    log: list[tuple[str, object]] | None = None,
    name: str = "",
) -> tuple[tuple[int, ...], object]:
    tokens: list[int] = []
    last: object = None
    async with engine.open_generation(request) as events:
        async for event in events:
            if log is not None:
                log.append((name, event))
            if isinstance(event, TokenGenerated):
                tokens.append(event.token_id)
            last = event
    return tuple(tokens), last


def greedy(prompt: tuple[int, ...], max_new: int = 32, **fields: object) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_new_tokens=max_new, sampling=GREEDY, **fields)  # type: ignore[arg-type]


async def test_four_sequences_at_once_generate_what_each_generates_alone(engine, tokenizer) -> None:
    prompts = [question(tokenizer, topic) for topic in TOPICS]
    alone = [(await collect(engine, greedy(prompt)))[0] for prompt in prompts]
    together: dict[int, tuple[int, ...]] = {}

    async def one(index: int) -> None:
        together[index] = (await collect(engine, greedy(prompts[index])))[0]

    decodes_before = engine.statistics().n_decode_total
    for slot in engine.slots:  # every sequence starts cold, as each did alone
        engine.current.context.caches[slot.id].clear()
    async with trio.open_nursery() as nursery:
        for index in range(len(prompts)):
            nursery.start_soon(one, index)
    assert [together[index] for index in range(len(prompts))] == alone
    statistics = engine.statistics()
    # four sequences of 32 tokens in fewer steps than one after another
    assert statistics.n_decode_total - decodes_before < 4 * 32
    assert statistics.n_busy_slots_per_decode > 1.0
    assert not any(slot.is_processing for slot in statistics.slots)


async def test_a_long_new_prompt_delays_a_running_stream_by_one_chunk_a_step(engine, tokenizer) -> None:
    """While a 700-token prompt is read in 64-token chunks, the running stream gets a token every step."""
    log: list[tuple[str, object]] = []
    running = greedy(question(tokenizer, "whales"), max_new=120, ignore_eos=True)
    long_prompt = question(tokenizer, "glaciers", repeat=170)
    assert len(long_prompt) > 640
    started = trio.Event()

    async def stream() -> None:
        async with engine.open_generation(running) as events:
            async for event in events:
                log.append(("running", event))
                if isinstance(event, TokenGenerated) and not started.is_set():
                    started.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await started.wait()
        await collect(engine, greedy(long_prompt, max_new=4), log, "new")
    progress = [  # the chunks read (the first report, before any, is not one)
        i
        for i, (name, event) in enumerate(log)
        if name == "new" and isinstance(event, PromptProgress) and event.processed
    ]
    assert len(progress) >= 10  # the prompt went in chunks
    between = log[progress[0] : progress[-1]]
    tokens_meanwhile = sum(
        1 for name, event in between if name == "running" and isinstance(event, TokenGenerated)
    )
    # A step's token and chunk reach two consumer tasks, which trio runs in either order: the last
    # chunk's step's token may be logged after that chunk, outside the window.
    assert tokens_meanwhile >= len(progress) - 2


async def test_a_sequence_that_leaves_disturbs_no_other(engine, tokenizer) -> None:
    prompts = [question(tokenizer, topic) for topic in TOPICS[:3]]
    alone = [(await collect(engine, greedy(prompt, max_new=24)))[0] for prompt in prompts]
    kept: dict[int, tuple[int, ...]] = {}

    async def keep(index: int) -> None:
        kept[index] = (await collect(engine, greedy(prompts[index], max_new=24)))[0]

    async def leave() -> None:
        async with engine.open_generation(greedy(prompts[1], max_new=24)) as events:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    return  # the client leaves after its first token

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep, 0)
        nursery.start_soon(leave)
        nursery.start_soon(keep, 2)
    assert kept == {0: alone[0], 2: alone[2]}
    await engine.wait_idle()
    assert not any(slot.is_processing for slot in engine.statistics().slots)


async def test_a_full_shared_context_ends_one_sequence_and_serves_on(model_path: Path, tokenizer) -> None:
    """Two slots share 512 tokens: the second long prompt finds no room, one request ends, the engine lives."""
    engine = load_llama_engine(
        engine_options(model_path=model_path, n_ctx=512, n_threads=2, n_parallel=2, prefill_chunk=64)
    )
    try:
        prompts = [question(tokenizer, topic, repeat=55)[:300] for topic in TOPICS[:2]]
        endings: list[object] = []

        async def one(prompt: tuple[int, ...]) -> None:
            endings.append((await collect(engine, greedy(prompt, max_new=150, ignore_eos=True)))[1])

        async with trio.open_nursery() as nursery:
            for prompt in prompts:
                nursery.start_soon(one, prompt)
        failed = [e for e in endings if isinstance(e, GenerationFailed)]
        assert len(failed) == 1
        assert failed[0].error.code == "context_full"  # type: ignore[attr-defined]
        assert not [e for e in endings if isinstance(e, GenerationFinished) and e.cause is StopCause.CONTEXT]
        tokens, last = await collect(engine, greedy(question(tokenizer, "tides"), max_new=4))
        assert isinstance(last, GenerationFinished)
        assert len(tokens) == 4
    finally:
        engine.close()
