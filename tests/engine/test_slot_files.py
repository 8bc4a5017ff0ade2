"""Slot files on the real engine: save, erase and restore run between decode steps of the other slots.

Each slot has a KV cache of its own (``kv_unified=False``), so a greedy stream's
tokens do not depend on what else runs, and any change would be the actions'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bubo.domain.generation import GenerationFinished, GenerationRequest
from bubo.engine import EngineFailure, SlotBusy, SlotFileNoRoom
from bubo.engine.errors import Cause
from bubo.engine.llama import LlamaEngine, load_llama_engine

from .._llama_options import engine_options, loaded_engine
from ._generation import GREEDY, generate

pytestmark = pytest.mark.llama

TEXT = "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(name="engine", scope="module")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(
        model_path=model_path, n_ctx=512, n_threads=2, n_parallel=2, kv_unified=False
    ) as engine:
        yield engine


async def run(engine: LlamaEngine, request: GenerationRequest) -> tuple[tuple[int, ...], GenerationFinished]:
    generated = await generate(engine, request)
    return generated.ids, generated.finished


def greedy(prompt: tuple[int, ...], slot: int, max_new: int = 16) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_new_tokens=max_new, sampling=GREEDY, slot=slot)


async def test_restore_continues_as_before_and_reuses_the_prefix(engine, tokenizer, tmp_path) -> None:
    prompt = tuple(tokenizer.encode(TEXT))
    before, _ = await run(engine, greedy(prompt, slot=0))
    saved = await engine.save_slot(0, tmp_path / "slot.bin")
    assert saved.n_tokens == engine.slots[0].n_cached >= len(prompt)
    assert await engine.erase_slot(0) == saved.n_tokens
    assert engine.slots[0].n_cached == 0
    restored = await engine.restore_slot(0, tmp_path / "slot.bin")
    assert restored.n_tokens == saved.n_tokens
    assert restored.n_bytes == saved.n_bytes == (tmp_path / "slot.bin").stat().st_size
    after, finished = await run(engine, greedy(prompt, slot=0))
    assert after == before
    assert finished.stats.cached_tokens == len(prompt) - 1
    assert finished.stats.cache.hit


async def test_actions_leave_a_running_stream_alone(engine, tokenizer, tmp_path) -> None:
    """Save, erase and restore of slot 0 while slot 1 streams: slot 1's tokens are those it makes alone."""
    prompt = tuple(tokenizer.encode(TEXT))
    other = tuple(tokenizer.encode(TEXT.replace("lighthouse keeper", "baker")))
    await run(engine, greedy(prompt, slot=0))
    alone, _ = await run(engine, greedy(other, slot=1, max_new=64))
    await engine.erase_slot(1)
    actions = 0

    async def act(stream_done: trio.Event) -> None:
        nonlocal actions
        while not stream_done.is_set():
            await engine.save_slot(0, tmp_path / "busy.bin")
            await engine.erase_slot(0)
            await engine.restore_slot(0, tmp_path / "busy.bin")
            actions += 1

    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(act, done)
        together, _ = await run(engine, greedy(other, slot=1, max_new=64))
        done.set()
    assert together == alone
    assert actions >= 1


async def test_a_busy_slot_is_refused(engine, tokenizer, tmp_path) -> None:
    prompt = tuple(tokenizer.encode(TEXT))
    async with engine.open_generation(greedy(prompt, slot=0, max_new=8)) as events:
        with pytest.raises(SlotBusy):
            await engine.save_slot(0, tmp_path / "x.bin")
        async for _ in events:
            pass


async def test_an_unreadable_file_empties_the_slot_and_it_serves_on(engine, tokenizer, tmp_path) -> None:
    prompt = tuple(tokenizer.encode(TEXT))
    await run(engine, greedy(prompt, slot=0))
    (tmp_path / "junk.bin").write_bytes(b"\x00" * 4096)
    with pytest.raises(EngineFailure) as failure:
        await engine.restore_slot(0, tmp_path / "junk.bin")
    assert not failure.value.fatal
    assert engine.slots[0].n_cached == 0
    tokens, finished = await run(engine, greedy(prompt, slot=0))
    assert tokens
    assert finished.stats.cached_tokens == 0


async def test_a_restore_the_shared_context_has_no_room_for_is_503_not_invalid(
    model_path, tokenizer, tmp_path
) -> None:
    """Slots sharing the context: a file larger than the room the others leave is 'retry later'."""
    engine = load_llama_engine(
        engine_options(model_path=model_path, n_ctx=512, n_threads=1, n_parallel=2, kv_unified=True)
    )
    try:
        story = tuple(tokenizer.encode("The lighthouse keeper watched the sea. " * 40))
        assert 256 < len(story) - 8 < len(story) + 1 < 512
        await run(engine, greedy(story, slot=0, max_new=1))
        saved = await engine.save_slot(0, tmp_path / "big.bin")
        await engine.erase_slot(0)
        await run(engine, greedy(story[:-8], slot=1, max_new=1))  # slot 1 now holds over half
        with pytest.raises(SlotFileNoRoom) as raised:
            await engine.restore_slot(0, tmp_path / "big.bin")
        assert raised.value.cause is Cause.CONTEXT_FULL  # the API answers 503 with Retry-After
        assert f"holds {saved.n_tokens} tokens" in raised.value.message
        await engine.erase_slot(1)
        assert (await engine.restore_slot(0, tmp_path / "big.bin")).n_tokens == saved.n_tokens
        (tmp_path / "bad.bin").write_bytes(b"not a state file")
        with pytest.raises(EngineFailure) as bad:
            await engine.restore_slot(0, tmp_path / "bad.bin")
        assert not isinstance(bad.value, SlotFileNoRoom)
    finally:
        engine.close()
