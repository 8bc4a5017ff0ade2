"""The prompt cache and prompt-lookup drafting on the real default model."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from bubo.domain.generation import CacheTags, GenerationRequest
from bubo.domain.sampling import SamplingParams
from bubo.engine._disk_cache import WRITER_THREAD_NAME, DiskTier
from bubo.engine.llama import DraftOptions, LlamaEngine, LlamaOptions, load_llama_engine
from bubo.model import read_metadata
from bubo.tokenizer import build_hf_tokenizer

from .._models import gemma3_path
from ._generation import GREEDY, generate

pytestmark = pytest.mark.llama

ANSWER = 8  # tokens of the answers compared with a cold run's


def load(path: Path, **options: object) -> LlamaEngine:
    return load_llama_engine(LlamaOptions(model_path=path, n_ctx=2048, n_threads=2, **options))  # type: ignore[arg-type]


async def run(engine: LlamaEngine, prompt: tuple[int, ...], max_new: int = 4, **fields: object):
    fields.setdefault("sampling", GREEDY)
    request = GenerationRequest(prompt_tokens=prompt, max_new_tokens=max_new, **fields)  # type: ignore[arg-type]
    generated = await generate(engine, request)
    return list(generated.ids), generated.finished


def conversation(tokenizer, topic: str, turns: int = 1) -> tuple[int, ...]:
    text = f"<|im_start|>system\nYou are an expert on {topic}.<|im_end|>\n"
    for turn in range(turns):
        text += f"<|im_start|>user\nTell me fact number {turn} about {topic}, in detail please.<|im_end|>\n"
        text += f"<|im_start|>assistant\nHere is fact {turn} about {topic}: it is remarkable.<|im_end|>\n" * 3
    return tuple(tokenizer.encode(text))


@pytest.fixture(name="engine")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load(model_path)
    yield engine
    engine.close()


class TestSnapshots:
    async def test_a_conversation_that_left_comes_back_warm(self, engine, tokenizer) -> None:
        """A, then B, then A continued: A's prefix is restored from host RAM, not re-evaluated."""
        a1, b1, a2 = (
            conversation(tokenizer, "whales"),
            conversation(tokenizer, "volcanoes"),
            conversation(tokenizer, "whales", 2),
        )
        await run(engine, a1)
        await run(engine, b1)
        _, finished = await run(engine, a2)
        stats = finished.stats
        assert stats.cache.hit
        assert stats.cached_tokens >= len(a1) - 1
        assert stats.cache.restored_bytes > 0
        assert [s.n_tokens for s in engine.cache_contents().snapshots]  # B was saved when A came back

    async def test_interleaved_conversations_each_keep_their_prefix(self, engine, tokenizer) -> None:
        """Three agents taking turns: after their first turn, every turn is a cache hit."""
        topics = ["whales", "volcanoes", "glaciers"]
        for turn in (1, 2, 3):
            for topic in topics:
                prompt = conversation(tokenizer, topic, turn)
                _, finished = await run(engine, prompt)
                if turn > 1:
                    assert finished.stats.cache.hit, (topic, turn)
                    assert finished.stats.cached_tokens >= len(conversation(tokenizer, topic, turn - 1)) - 1

    async def test_eviction_under_the_byte_budget(self, engine, tokenizer) -> None:
        """With room for one snapshot the older one goes; its return is an 'evicted' miss."""
        await run(engine, conversation(tokenizer, "whales"))
        await run(engine, conversation(tokenizer, "volcanoes"))  # whales leaves the slot: saved
        store = engine._current.context.caches[0].store
        assert store is not None
        one = store.snapshots()[0].size_bytes
        store.budget_bytes = one + one // 2  # exactly one snapshot fits now
        await run(engine, conversation(tokenizer, "glaciers"))  # volcanoes saved, whales evicted
        assert [s.conversation for s in store.snapshots()] == [None]
        assert store.total_bytes <= store.budget_bytes
        _, finished = await run(engine, conversation(tokenizer, "whales"))
        assert (finished.stats.cache.hit, finished.stats.cache.miss_reason) == (False, "evicted")

    async def test_template_changed(self, engine, tokenizer) -> None:
        """The same conversation rendered differently is a 'template_changed' miss."""
        await run(
            engine, conversation(tokenizer, "whales"), cache_tags=CacheTags(conversation="c1", template="t1")
        )
        different = tuple(tokenizer.encode("<|im_start|>system\nRendered another way<|im_end|>\n"))
        _, finished = await run(engine, different, cache_tags=CacheTags(conversation="c1", template="t2"))
        assert finished.stats.cache.miss_reason == "template_changed"

    async def test_disabled(self, model_path: Path, tokenizer) -> None:
        """With --cache-ram 0 nothing is saved: a returning conversation is a 'disabled' miss."""
        engine = load(model_path, cache_ram_mib=0)
        try:
            await run(engine, conversation(tokenizer, "whales"))
            await run(engine, conversation(tokenizer, "volcanoes"))
            _, finished = await run(engine, conversation(tokenizer, "whales"))
            assert (finished.stats.cache.hit, finished.stats.cache.miss_reason) == (False, "disabled")
            assert engine.cache_contents().snapshots == ()
        finally:
            engine.close()

    async def test_restored_state_gives_the_same_output(self, engine, tokenizer) -> None:
        """Greedy output after a restore equals greedy output after a fresh prefill."""
        a, b = conversation(tokenizer, "whales", 2), conversation(tokenizer, "volcanoes")
        fresh, _ = await run(engine, a, max_new=24)
        await run(engine, b)
        restored, finished = await run(engine, a, max_new=24)
        assert finished.stats.cache.restored_bytes > 0
        assert restored == fresh


class TestIdleSlotsLeaveTheUnifiedCache:
    """With several slots, a request that starts moves the idle slots' sequences to host RAM.

    Every step attends over the unified cache's cells up to the highest one in
    use, whoever holds them (docs/performance.md, "Idle slots in the unified
    cache"); llama-server's ``--cache-idle-slots`` does the same.
    """

    async def test_their_cells_are_freed_and_their_conversation_comes_back_warm(
        self, model_path: Path, tokenizer
    ) -> None:
        a1, b1, a2 = (
            conversation(tokenizer, "whales"),
            conversation(tokenizer, "volcanoes"),
            conversation(tokenizer, "whales", 2),
        )
        engine = load(model_path, n_parallel=2)
        try:
            await run(engine, a1, slot=0)
            held_by_a = engine.slots[0].n_cached
            await run(engine, b1, slot=1)
            contents = engine.cache_contents()
            assert engine.slots[0].n_cached == 0
            assert contents.live_tokens == engine.slots[1].n_cached
            assert [s.n_tokens for s in contents.snapshots] == [held_by_a]
            _, finished = await run(engine, a2, slot=0)
        finally:
            engine.close()
        assert finished.stats.cache.restored_bytes > 0
        assert finished.stats.cached_tokens >= len(a1) - 1

    async def test_a_prefix_an_idle_slot_held_stays_shared_by_the_request_that_took_it(
        self, model_path: Path, tokenizer
    ) -> None:
        a, sub = conversation(tokenizer, "whales"), conversation(tokenizer, "whales", 2)
        engine = load(model_path, n_parallel=2)
        try:
            await run(engine, a, slot=0)
            _, finished = await run(engine, sub, slot=1)
            idle, live = engine.slots[0].n_cached, engine.cache_contents().live_tokens
            held = engine.slots[1].n_cached
        finally:
            engine.close()
        assert finished.stats.cache.shared_tokens >= len(a) - 1
        assert finished.stats.cache.restored_bytes == 0
        assert (idle, live) == (0, held)

    async def test_one_larger_than_the_whole_snapshot_budget_stays_in_place(
        self, model_path: Path, tokenizer
    ) -> None:
        """A snapshot over budget would be dropped at once: parking it would lose the conversation."""
        a, b = conversation(tokenizer, "whales"), conversation(tokenizer, "volcanoes")
        engine = load(model_path, n_parallel=2, cache_ram_mib=1)  # 1 MiB: ~45 tokens of this model
        try:
            await run(engine, a, slot=0)
            held_by_a = engine.slots[0].n_cached
            await run(engine, b, slot=1)
            still_held = engine.slots[0].n_cached
        finally:
            engine.close()
        assert still_held == held_by_a >= len(a)

    async def test_not_with_no_cache_idle_slots(self, model_path: Path, tokenizer) -> None:
        a, b = conversation(tokenizer, "whales"), conversation(tokenizer, "volcanoes")
        engine = load(model_path, n_parallel=2, cache_idle_slots=False)
        try:
            await run(engine, a, slot=0)
            await run(engine, b, slot=1)
            held = (engine.slots[0].n_cached, engine.slots[1].n_cached)
            contents = engine.cache_contents()
        finally:
            engine.close()
        assert held[0] >= len(a)
        assert contents.live_tokens > max(held)  # both hold cells (their shared system prompt counts once)
        assert contents.snapshots == ()


@attrs.define
class DiskDays:
    """What the disk-tier tests share (each model run costs seconds): first days' directories, cold answers."""

    root: Path
    days: dict[tuple[int, ...], Path] = attrs.Factory(dict)
    answers: dict[tuple[int, ...], list[int]] = attrs.Factory(dict)


@pytest.fixture(name="disk_days", scope="module")
def _disk_days(tmp_path_factory: pytest.TempPathFactory) -> DiskDays:
    return DiskDays(root=tmp_path_factory.mktemp("disk-days"))


class TestDiskTier:
    """Snapshots in files: a restarted engine restores a conversation's prefix instead of reading it."""

    @staticmethod
    def load(model_path: Path, directory: Path, mib: int = 64, **options: object) -> LlamaEngine:
        options = {"n_ctx": 1024, "cache_disk_dir": directory, "cache_disk_mib": mib, **options}
        return load_llama_engine(LlamaOptions(model_path=model_path, n_threads=2, **options))  # type: ignore[arg-type]

    @staticmethod
    async def cold(model_path: Path, prompt: tuple[int, ...], shared: DiskDays) -> list[int]:
        """The greedy answer of an engine that reads *prompt* whole (computed once per module)."""
        if prompt not in shared.answers:
            options = LlamaOptions(model_path=model_path, n_ctx=1024, n_threads=2, cache_ram_mib=0)
            engine = load_llama_engine(options)
            try:
                tokens, finished = await run(engine, prompt, max_new=ANSWER)
            finally:
                engine.close()
            assert finished.stats.cached_tokens == 0
            shared.answers[prompt] = tokens
        return shared.answers[prompt]

    @staticmethod
    def files(directory: Path) -> list[Path]:
        return sorted(directory.rglob("*.kvc"))

    async def first_day(
        self, model_path: Path, directory: Path, prompt: tuple[int, ...], shared: DiskDays
    ) -> None:
        """Fill *directory* as an engine that served *prompt*, then closed, leaves it (run once per module)."""
        if prompt not in shared.days:
            day = shared.root / f"day{len(shared.days)}"
            engine = self.load(model_path, day)
            try:
                await run(engine, prompt)
            finally:
                engine.close()  # the live sequence is written as the engine closes
            assert len(self.files(day)) == 1
            shared.days[prompt] = day
        shutil.copytree(shared.days[prompt], directory, dirs_exist_ok=True)

    async def test_a_restart_restores_the_prefix_from_disk(
        self, model_path: Path, tokenizer, tmp_path: Path, disk_days: DiskDays
    ) -> None:
        """After a restart the next turn evaluates only its new tokens, and answers as a cold run does."""
        turn1, turn2 = conversation(tokenizer, "volcanoes"), conversation(tokenizer, "volcanoes", 2)
        await self.first_day(model_path, tmp_path, turn1, disk_days)
        engine = self.load(model_path, tmp_path)
        try:
            (entry,) = engine.cache_contents().disk_snapshots
            assert entry.tier == "disk"
            assert entry.n_tokens >= len(turn1)
            tokens, finished = await run(engine, turn2, max_new=ANSWER)
        finally:
            engine.close()
        stats = finished.stats
        assert stats.cache.hit
        assert stats.cache.restored_bytes > 0
        assert stats.cached_tokens >= len(turn1) - 1
        assert stats.evaluated_tokens == len(turn2) - stats.cached_tokens  # only the suffix was read
        assert stats.evaluated_tokens <= len(turn2) - len(turn1) + 1
        assert tokens == await self.cold(model_path, turn2, disk_days)

    async def test_the_tier_outlives_a_sleep(
        self, model_path: Path, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Sleeping writes the live sequence before its context goes; after waking the next turn restores it."""
        turn1, turn2 = conversation(tokenizer, "glaciers"), conversation(tokenizer, "glaciers", 2)
        engine = self.load(model_path, tmp_path)
        try:
            disk = engine._load.lasting.disk
            assert disk is not None
            # no idle work: the live sequence reaches the disk only as the engine falls asleep
            monkeypatch.setattr(engine._current.loop, "schedule_idle", lambda job: None)
            await run(engine, turn1)
            assert disk.entries() == []
            assert await engine.sleep() is True
            assert disk.flush(30)
            (entry,) = engine.cache_contents().disk_snapshots  # listed while asleep too
            assert entry.n_tokens >= len(turn1)
            _, finished = await run(engine, turn2)
            assert engine.sleeps == 1
            assert engine._load.lasting.disk is disk  # the engine's own tier, not a new one per context
        finally:
            engine.close()
        stats = finished.stats
        assert stats.cache.restored_bytes > 0
        assert stats.cached_tokens >= len(turn1) - 1
        writer = disk._thread  # this tier's writer (other tests' tiers may still run theirs)
        assert writer is not None
        assert not writer.is_alive()  # drained and stopped on close, not on sleep

    def test_the_kv_cache_types_are_part_of_the_identity(self, model_path: Path, tmp_path: Path) -> None:
        """-ctk/-ctv change the cells a file holds: another KV type looks in another directory."""
        directories = []
        for cache_type_k in ("f16", "q8_0", "f16"):
            engine = self.load(model_path, tmp_path, cache_type_k=cache_type_k)
            try:
                assert engine._load.lasting.disk is not None
                directories.append(engine._load.lasting.disk.directory)
            finally:
                engine.close()
        assert directories[0] != directories[1]
        assert directories[0] == directories[2]

    @pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
    async def test_a_damaged_file_is_skipped(
        self,
        model_path: Path,
        tokenizer,
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
        disk_days: DiskDays,
        damage: str,
    ) -> None:
        """A flipped byte, a file cut short or another model's file: a warning, no restore, a correct answer."""
        turn1, turn2 = conversation(tokenizer, "volcanoes"), conversation(tokenizer, "volcanoes", 2)
        await self.first_day(model_path, tmp_path, turn1, disk_days)
        (path,) = self.files(tmp_path)
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(data)
        elif damage == "truncate":
            path.write_bytes(data[: len(data) - 1000])
        else:  # the same tokens' state, written for another model identity, put in this model's directory
            foreign = DiskTier(tmp_path / "elsewhere", identity="f" * 64, budget_bytes=len(data) * 2)
            foreign.put(list(range(len(turn1))), memoryview(bytes(data)))
            foreign.close()
            (source,) = self.files(tmp_path / "elsewhere")
            path.write_bytes(source.read_bytes())
        caplog.set_level(logging.WARNING, logger="bubo.engine._disk_cache")
        engine = self.load(model_path, tmp_path)
        try:
            tokens, finished = await run(engine, turn2, max_new=ANSWER)
        finally:
            engine.close()
        assert "prompt-cache file" in caplog.text
        assert "skipped" in caplog.text
        assert finished.stats.cache.restored_bytes == 0
        assert finished.stats.cached_tokens == 0
        assert tokens == await self.cold(model_path, turn2, disk_days)

    async def test_files_are_written_off_the_decode_thread_within_the_budget(
        self, model_path: Path, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The decode thread only queues snapshots; the writer thread writes them and holds the budget.

        With room for one file (a ~100-token snapshot of this model is ~2.3 MB), the conversation that
        left the slot is written, then replaced by the one persisted while the engine is idle.
        """
        writers: list[str] = []
        write = DiskTier._write

        def recording_write(self: DiskTier, job: object) -> None:
            writers.append(threading.current_thread().name)
            write(self, job)  # type: ignore[arg-type]

        monkeypatch.setattr(DiskTier, "_write", recording_write)
        engine = self.load(model_path, tmp_path, mib=3)
        try:
            await run(engine, conversation(tokenizer, "whales"))
            await run(engine, conversation(tokenizer, "deserts"))  # whales leaves the slot: queued
            await engine.settle()  # deserts is queued while the engine is idle
            disk = engine._load.lasting.disk
            assert disk is not None
            assert disk.flush(30)
            assert disk.total_bytes <= disk.budget_bytes
            assert len(self.files(tmp_path)) == len(disk.entries()) == 1
            assert sum(p.stat().st_size for p in self.files(tmp_path)) <= 3 << 20
            # the file holds what the slot holds: the next turn reads nothing from disk
            assert not engine._current.context.caches[0].read_from_disk(
                conversation(tokenizer, "deserts", 2), 1024
            )
        finally:
            engine.close()
        assert len(writers) == 2
        assert set(writers) == {WRITER_THREAD_NAME}


class TestSlidingWindow:
    async def test_gemma_prefix_reuse(self) -> None:
        """Gemma 3 (sliding-window attention) keeps a full-size cache, so its prefix is reused.

        Flash attention is off here: llama.cpp's CPU flash attention evaluates a prefix plus
        a suffix differently from the whole on some CPUs (on an AVX-512 Xeon the first logits
        moved by 0.8, enough to swap a near tie), while without it the two are bit-identical.
        So the reused answer must equal the fresh one token for token.
        """
        path = gemma3_path()
        tokenizer = build_hf_tokenizer(read_metadata(path))
        engine = load(path, flash_attn="off")
        try:
            base = "The history of the lighthouse is long and full of storms. " * 12
            first = tuple(tokenizer.encode(base + "First question:", add_special=True))
            second = tuple(tokenizer.encode(base + "Second question:", add_special=True))
            fresh, _ = await run(engine, second, max_new=12)
            await run(engine, first)
            reused, finished = await run(engine, second, max_new=12)
            assert finished.stats.cache.hit
            assert finished.stats.cached_tokens > len(first) // 2
            assert reused == fresh  # a cut-down SWA cache would derail the answer
        finally:
            engine.close()


class TestDrafting:
    CODE = (
        "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n"
        "    return result\n\n\ndef average(items):\n    return total(items) / len(items)\n"
    )

    def prompt(self, tokenizer) -> tuple[int, ...]:
        text = (
            "<|im_start|>user\nRepeat this code exactly, renaming nothing:\n```python\n"
            f"{self.CODE}```<|im_end|>\n<|im_start|>assistant\n```python\n"
        )
        return tuple(tokenizer.encode(text))

    async def test_greedy_output_is_identical_with_drafting(self, model_path: Path, tokenizer) -> None:
        """Drafting changes how many tokens one decode evaluates, never which tokens come out.

        Kept under 256 tokens of context: there llama.cpp's CPU attention computes a
        token alike alone and in a batch, so the outputs must agree bit for bit.
        Beyond, a single token takes a split-KV path whose rounding differs, and
        (as llama-server documents for its prompt cache) a near-tie may resolve
        differently; docs/prompt-cache.md has the details.
        """
        prompt = self.prompt(tokenizer)
        plain = load(model_path, drafting=DraftOptions(draft_max=0))
        drafting = load(model_path, drafting=DraftOptions(draft_max=16))
        try:
            # each engine runs the prompt twice: cold, then from the cache (as the policy has learnt)
            expected = [(await run(plain, prompt, max_new=96))[0] for _ in range(2)]
            first, _ = await run(drafting, prompt, max_new=96)
            second, finished = await run(drafting, prompt, max_new=96)
            assert len(prompt) + 96 < 256
            assert [first, second] == expected
            assert finished.stats.draft_tokens > 0
            assert finished.stats.draft_accepted > 0
            assert drafting.statistics().draft_accepted_total >= finished.stats.draft_accepted
        finally:
            plain.close()
            drafting.close()

    async def test_seeded_sampling_with_drafting_matches(self, model_path: Path, tokenizer) -> None:
        """With a temperature and a seed, drafting reproduces the undrafted output too."""
        sampling = SamplingParams(temperature=0.7, seed=7)
        plain = load(model_path, drafting=DraftOptions(draft_max=0))
        drafting = load(model_path, drafting=DraftOptions(draft_max=8))
        try:
            expected, _ = await run(plain, self.prompt(tokenizer), max_new=64, sampling=sampling)
            got, _ = await run(drafting, self.prompt(tokenizer), max_new=64, sampling=sampling)
            assert got == expected
        finally:
            plain.close()
            drafting.close()


class TestNextTurnWarmUp:
    """While idle, the engine evaluates the end of turn the next prompt will start with."""

    END_OF_TURN = "<|im_end|>\n<|im_start|>user\n"

    async def next_turn(self, engine: LlamaEngine, tokenizer, *, max_new: int) -> tuple[int, int, int]:
        """Turn 1, the idle work, then turn 2: (turn-2 prompt length, tokens it reused, turn-1 prompt+output)."""
        continuation = tuple(tokenizer.encode(self.END_OF_TURN))
        first = conversation(tokenizer, "tides")
        answer, _ = await run(engine, first, max_new=max_new, continuation=continuation)
        await engine.settle()  # the warm-up ran
        text = tokenizer.decode(answer).removesuffix("<|im_end|>")
        second = tuple(
            tokenizer.encode(tokenizer.decode(first) + text + self.END_OF_TURN + "And the moon?<|im_end|>\n")
        )
        _, finished = await run(engine, second)
        return len(second), finished.stats.cached_tokens, len(first) + len(answer)

    async def test_an_answer_cut_by_its_limit(self, engine, tokenizer) -> None:
        """The last token (never evaluated) and the end of turn are in the cache before turn 2 comes."""
        n_second, cached, n_first = await self.next_turn(engine, tokenizer, max_new=6)
        assert cached >= n_first + len(tokenizer.encode(self.END_OF_TURN))
        assert cached < n_second

    async def test_without_idle_work_only_the_evaluated_part_is_reused(self, engine, tokenizer) -> None:
        first = conversation(tokenizer, "tides")
        answer, _ = await run(engine, first, max_new=6)  # no continuation: nothing to warm
        second = tuple(
            tokenizer.encode(tokenizer.decode(first) + tokenizer.decode(answer) + self.END_OF_TURN)
        )
        _, finished = await run(engine, (*second, 42))
        assert finished.stats.cached_tokens == len(first) + len(answer) - 1

    async def test_a_request_that_comes_first_makes_the_warm_up_stale(self, engine, tokenizer) -> None:
        """Another conversation takes the slot before or after the idle work: its cache is never touched."""
        continuation = tuple(tokenizer.encode(self.END_OF_TURN))
        await run(engine, conversation(tokenizer, "tides"), continuation=continuation)
        other = conversation(tokenizer, "volcanoes")
        await run(engine, other)  # races the warm-up: first, it makes it stale; after, it trims it
        await engine.settle()
        _, finished = await run(engine, (*other, 42))
        assert finished.stats.cached_tokens == len(other)
