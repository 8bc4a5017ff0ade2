"""What each decode step carries on the real engine while prompts are read, counted, not timed.

Alone, a prompt is read in the largest batches the context takes.  Beside
decoding streams every step carries each stream's token, and the prompt's
chunk is bounded by what keeps the step under the target gap (and is at least
half a micro-batch: smaller chunks read each token slower).  Two prompts
read together share each step: neither waits for the other to finish.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import trio

from bubo.domain.generation import GenerationFinished, GenerationRequest, TokenGenerated
from bubo.engine._protocols import BatchEntry
from bubo.engine.llama import LlamaEngine

from .._llama_options import loaded_engine
from ._generation import GREEDY

pytestmark = pytest.mark.llama

UBATCH = 128  # a beside-streams chunk is at least half of it: small enough here to see several
Step = dict[int, int]  # slot -> tokens it put in the step


@pytest.fixture(name="engine")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(
        model_path=model_path,
        n_ctx=4096,
        n_threads=2,
        n_parallel=4,
        n_batch=512,
        n_ubatch=UBATCH,
        prefill_gap_ms=200,
    ) as engine:
        yield engine


@pytest.fixture(name="steps")
def _steps(engine: LlamaEngine, monkeypatch: pytest.MonkeyPatch) -> list[Step]:
    """Every step's composition, recorded around the real context's decode."""
    context = engine.current.context
    decode = context.decode_batch
    steps: list[Step] = []

    def recording(entries: Sequence[BatchEntry]) -> list[int]:
        steps.append({entry.cache.seq_id: len(entry.tokens) for entry in entries})
        return decode(entries)

    monkeypatch.setattr(context, "decode_batch", recording)
    return steps


def long_prompt(engine: LlamaEngine, n: int, seed: int) -> tuple[int, ...]:
    text = " ".join(f"record {seed}.{i} holds a value." for i in range(n))
    tokens = engine.current.context.tokenize(text)[:n]
    assert len(tokens) == n
    return tokens


async def generate(
    engine: LlamaEngine, prompt: tuple[int, ...], slot: int, max_new: int, **fields: object
) -> int:
    request = GenerationRequest(
        prompt_tokens=prompt, max_new_tokens=max_new, sampling=GREEDY, slot=slot, cache_prompt=False, **fields
    )  # type: ignore[arg-type]
    n = 0
    async with engine.open_generation(request) as events:
        async for event in events:
            n += isinstance(event, TokenGenerated)
            if isinstance(event, GenerationFinished):
                break
    return n


async def streams_beside(engine: LlamaEngine, slots: Sequence[int], reading: trio.Event) -> None:
    """Greedy streams in *slots*, decoding until *reading* is set."""
    async with trio.open_nursery() as nursery:
        for slot in slots:
            prompt = long_prompt(engine, 8, 100 + slot)
            nursery.start_soon(lambda p=prompt, s=slot: generate(engine, p, s, 100_000, ignore_eos=True))
        await reading.wait()
        nursery.cancel_scope.cancel()


def prompt_steps(steps: list[Step], slot: int, n_prompt: int) -> list[Step]:
    """The steps that carried a part of *slot*'s prompt of *n_prompt* tokens."""
    out, read = [], 0
    for step in steps:
        if read < n_prompt and slot in step:
            out.append(step)
            read += step[slot]
    return out


async def test_a_lone_prompt_is_read_in_whole_batches(engine, steps) -> None:
    prompt = long_prompt(engine, 700, 1)
    await generate(engine, prompt, slot=0, max_new=1)
    read = prompt_steps(steps, 0, len(prompt))
    assert [step[0] for step in read] == [512, 700 - 512]  # n_batch a step, not a small chunk
    assert len(read) == math.ceil(len(prompt) / 512)


async def test_beside_streams_every_step_carries_each_stream_and_a_bounded_chunk(engine, steps) -> None:
    prompt = long_prompt(engine, 400, 2)
    done = trio.Event()

    async def newcomer() -> None:
        while sum(1 for step in steps if {0, 1, 2} <= step.keys()) < 6:
            await trio.sleep(0.02)
        await generate(engine, prompt, slot=3, max_new=1)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(streams_beside, engine, (0, 1, 2), done)
        nursery.start_soon(newcomer)

    read = prompt_steps(steps, 3, len(prompt))
    assert sum(step[3] for step in read) == len(prompt)
    assert all(step[0] == step[1] == step[2] == 1 for step in read)  # every stream's token, every step
    chunks = [step[3] for step in read[:-1]]
    assert len(read) > 2  # read in several chunks, not in one batch that would stall the streams
    assert all(UBATCH // 2 <= chunk <= 512 - 3 for chunk in chunks)
    assert max(chunks) < len(prompt)


async def test_two_prompts_read_together_share_each_step(engine, steps) -> None:
    first, second = long_prompt(engine, 300, 3), long_prompt(engine, 300, 4)
    done = trio.Event()

    async def readers() -> None:
        while sum(1 for step in steps if 0 in step) < 4:
            await trio.sleep(0.02)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, first, 1, 1)
            nursery.start_soon(generate, engine, second, 2, 1)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(streams_beside, engine, (0,), done)
        nursery.start_soon(readers)

    together = [step for step in steps if 1 in step and 2 in step]
    read = {1: 0, 2: 0}
    for step in steps:
        if 1 in step and 2 in step and read[1] < 300 and read[2] < 300:
            assert step[0] == 1  # the stream's token goes on
        for slot in (1, 2):
            read[slot] += step.get(slot, 0)
    both_reading = [step for step in together if step[1] > 1 and step[2] > 1]
    assert len(both_reading) >= 2  # neither waited for the other's whole prompt
    first_done = next(i for i, step in enumerate(steps) if sum(s.get(1, 0) for s in steps[: i + 1]) >= 300)
    assert sum(s.get(2, 0) for s in steps[: first_done + 1]) > 0  # the younger advanced meanwhile
