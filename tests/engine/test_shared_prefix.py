"""A prefix shared across slots on the real engine: cells taken from another slot's sequence, not read again.

With the unified KV cache, a request whose prompt begins with what another
slot's sequence holds gets those cells (``llama_memory_seq_cp``) and
evaluates only the rest; its greedy output is a cold run's, the cells stay
when the first holder lets them go, and the context counts them once.

The answers are compared over their first 6 tokens: in the unified cache
llama.cpp attends over cells wherever they lie, and a cold run's cells lie
elsewhere, so near-tied tokens may later flip (measured: at the 8th to 10th
token of a 135M model's answer; docs/performance.md, "Parallel slots", saw the
same between batched and lone runs).  Cells that were wrong would change the
first tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bubo.domain.generation import GenerationRequest, GenerationStats, TokenGenerated
from bubo.engine.llama import LlamaEngine
from bubo.tokenizer import HFTokenizer

from .._llama_options import loaded_engine
from ._generation import GREEDY, generate

pytestmark = pytest.mark.llama

N_NEW = 6  # see the module's docstring: near-tied tokens later may differ in a unified cache


def prompt(tokenizer: HFTokenizer, prefix: str, question: str) -> tuple[int, ...]:
    text = f"<|im_start|>system\n{prefix}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tuple(tokenizer.encode(text))


def system_prompt(n_rules: int) -> str:
    return "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer about topic {i} briefly." for i in range(n_rules)
    )


async def run(
    engine: LlamaEngine, tokens: tuple[int, ...], slot: int, *, cache: bool = True
) -> tuple[list[int], GenerationStats]:

    request = GenerationRequest(
        prompt_tokens=tokens, max_new_tokens=N_NEW, sampling=GREEDY, slot=slot, cache_prompt=cache
    )
    generated = await generate(engine, request)
    return list(generated.ids), generated.finished.stats


@pytest.fixture(name="engine")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(
        model_path=model_path, n_ctx=2048, n_threads=2, n_parallel=3, cache_ram_mib=0
    ) as engine:
        yield engine


async def cold(engine: LlamaEngine, tokens: tuple[int, ...]) -> list[int]:
    """The greedy answer with nothing reused, in the slot no test shares with."""
    out, stats = await run(engine, tokens, slot=2, cache=False)
    assert stats.cached_tokens == 0
    await run(engine, tokens[-8:], slot=2, cache=False)  # and it holds nothing the others could share
    return out


class TestAPrefixAnotherSlotHolds:
    async def test_is_taken_from_its_cells_and_only_the_suffix_is_read(self, engine, tokenizer) -> None:
        prefix = system_prompt(16)
        first = prompt(tokenizer, prefix, "What is topic 3?")
        second = prompt(tokenizer, prefix, "Tell me about topic 17, please.")
        shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
        assert shared > 150
        expected = await cold(engine, second)
        await run(engine, first, slot=0)

        out, stats = await run(engine, second, slot=1)

        assert stats.cached_tokens == shared
        assert stats.cache.shared_tokens == shared
        assert stats.evaluated_tokens == len(second) - shared  # the suffix only
        slot = engine.statistics().slots[1]
        assert (slot.n_prompt_tokens_processed, slot.n_prompt_tokens_shared) == (len(second) - shared, shared)
        assert out == expected

    async def test_the_cells_stay_when_the_first_holder_is_overwritten(self, engine, tokenizer) -> None:
        prefix = system_prompt(16)
        first = prompt(tokenizer, prefix, "What is topic 3?")
        second = prompt(tokenizer, prefix, "Tell me about topic 17, please.")
        third = prompt(tokenizer, prefix, "And topic 29?")
        expected = await cold(engine, third)
        await run(engine, first, slot=0)
        await run(engine, second, slot=1)
        await run(engine, prompt(tokenizer, "Be terse.", "Name a colour."), slot=0)  # slot 0 lets them go
        assert engine.statistics().slots[0].n_prompt_tokens < 100

        out, stats = await run(engine, third, slot=1)  # from its own (once shared) cells

        assert stats.cache.shared_tokens == 0
        assert stats.cached_tokens > 150
        assert out == expected


class TestTheSharedContext:
    async def test_counts_a_shared_cell_once_and_admits_what_fits(self, model_path, tokenizer) -> None:
        """Three slots in a 1,536-token context: the tokens they hold add up past it, their cells do not."""
        with loaded_engine(
            model_path=model_path, n_ctx=1536, n_threads=2, n_parallel=3, cache_ram_mib=0
        ) as engine:
            prefix = system_prompt(55)
            first = prompt(tokenizer, prefix, "What is topic 3?")
            second = prompt(tokenizer, prefix, "Tell me about topic 17, please.")
            assert len(first) > 600
            await run(engine, first, slot=0)
            _, stats = await run(engine, second, slot=1)
            assert stats.cache.shared_tokens > 600
            holding = [slot.n_prompt_tokens for slot in engine.statistics().slots[:2]]
            other = prompt(tokenizer, "You write poems. " * 60, "A poem about rain.")
            assert sum(holding) + len(other) + N_NEW > 1536  # counted per slot, it would not fit

            _, stats = await run(engine, other, slot=2)

            assert stats.cached_tokens < 10  # the chat template's first tokens at most
            statistics = engine.statistics()
            assert [slot.n_prompt_tokens for slot in statistics.slots[:2]] == holding  # nobody was evicted
            used = statistics.kv_cache_tokens
            assert used == sum(slot.n_prompt_tokens for slot in statistics.slots) - stats_shared(statistics)
            assert used <= 1536


class TestTheRunningRequestsCells:
    async def test_are_the_held_slots_shared_ones_once_and_idle_ones_are_not(self, engine, tokenizer) -> None:
        """A gateway's KV usage: the cells a held slot's sequence holds, those it shares included, once."""
        prefix = system_prompt(16)
        first = prompt(tokenizer, prefix, "What is topic 3?")
        second = prompt(tokenizer, prefix, "Tell me about topic 17, please.")
        await run(engine, first, slot=0)
        idle = engine.statistics()
        kept = idle.slots[0].n_prompt_tokens  # the first prompt and its answer, cached for a next turn
        assert (idle.kv_cache_tokens, idle.kv_cache_tokens_running) == (kept, 0)
        # one token: once it is sampled nothing more is decoded, so the cells hold still while it is read
        request = GenerationRequest(prompt_tokens=second, max_new_tokens=1, sampling=GREEDY, slot=1)
        async with engine.open_generation(request) as events:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    running = engine.statistics()
                    break
        held = running.slots[1]
        assert held.n_prompt_tokens_shared > 150
        assert running.kv_cache_tokens_running == held.n_prompt_tokens  # the shared cells are its too
        private_to_the_idle_slot = kept - held.n_prompt_tokens_shared
        assert running.kv_cache_tokens == held.n_prompt_tokens + private_to_the_idle_slot
        assert engine.statistics().kv_cache_tokens_running == 0  # released


def stats_shared(statistics) -> int:
    return sum(slot.n_prompt_tokens_shared for slot in statistics.slots)


class TestCellsMovedByCacheReuse:
    @pytest.fixture(name="reusing")
    def _reusing(self, model_path: Path) -> Iterator[LlamaEngine]:
        with loaded_engine(
            model_path=model_path, n_ctx=2048, n_threads=2, n_parallel=2, cache_ram_mib=0, cache_reuse=16
        ) as engine:
            yield engine

    async def test_are_never_shared_as_an_exact_prefix(
        self, reusing: LlamaEngine, tokenizer: HFTokenizer
    ) -> None:
        head = tuple(tokenizer.encode("You are a careful assistant. " * 4))
        tail = tuple(tokenizer.encode(system_prompt(8)))
        await run(reusing, head + tuple(tokenizer.encode(" An old turn, about apples.")) + tail, slot=0)
        changed = head + tail  # the old turn dropped from the middle, as agents trim their history
        _, moved = await run(reusing, changed, slot=0)
        assert moved.cached_tokens > len(head) + 16  # the tail's cells were moved into place, not read
        _, taken = await run(reusing, changed, slot=1)
        assert 0 < taken.cache.shared_tokens <= len(head)  # only the cells evaluated where they lie

    async def test_are_not_written_to_disk(
        self, model_path: Path, tokenizer: HFTokenizer, tmp_path: Path
    ) -> None:
        """A file records every cell as evaluated in place, so a sequence holding moved cells is not one."""
        settings = {
            "model_path": model_path,
            "n_ctx": 2048,
            "n_threads": 2,
            "n_parallel": 1,
            "cache_ram_mib": 0,
            "cache_reuse": 16,
            "cache_disk_dir": tmp_path,
            "cache_disk_mib": 64,
        }
        head = tuple(tokenizer.encode("You are a careful assistant. " * 4))
        tail = tuple(tokenizer.encode(system_prompt(8)))
        changed = head + tail
        with loaded_engine(**settings) as engine:  # its close does not persist a sequence of moved cells
            await run(engine, head + tuple(tokenizer.encode(" An old turn, about apples.")) + tail, slot=0)
            _, moved = await run(engine, changed, slot=0)
            assert moved.cached_tokens > len(head) + 16
        with loaded_engine(**settings) as engine:
            _, after = await run(engine, changed, slot=0)
            assert after.cache.restored_bytes == 0  # only the first prompt's file exists; it shares the head
            assert after.cached_tokens <= len(head)


async def test_a_prefix_another_slot_holds_is_not_read_from_disk(
    model_path: Path, tokenizer: HFTokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sub-agents whose prefix another slot holds share its cells; checking a file for it is wasted work."""
    with loaded_engine(
        model_path=model_path,
        n_ctx=2048,
        n_threads=2,
        n_parallel=2,
        cache_ram_mib=0,
        cache_disk_dir=tmp_path,
        cache_disk_mib=64,
    ) as engine:
        disk = engine.current_load.lasting.disk  # what the engine reads from disk is the point
        assert disk is not None
        await run(engine, prompt(tokenizer, system_prompt(12), "Name a colour."), slot=0)
        for _ in range(100):  # slot 0's sequence is written once the engine is idle
            if disk.total_bytes:
                break
            await trio.sleep(0.1)
        assert disk.total_bytes
        reads: list[object] = []
        real_read = disk.read
        monkeypatch.setattr(disk, "read", lambda entry: reads.append(entry) or real_read(entry))
        _, stats = await run(engine, prompt(tokenizer, system_prompt(12), "Name a fruit."), slot=1)
        assert stats.cache.shared_tokens > 0
        assert reads == []
