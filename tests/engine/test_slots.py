"""Session slots with the fake engine: arrival order, slot choice, pinning, leaving, accounting."""

from __future__ import annotations

import trio
import trio.testing

from bubo.domain.generation import GenerationFinished, GenerationRequest, TokenGenerated
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.engine.lora import AdapterSet, LoraAdapter
from bubo.engine.slots import Slot, SlotPool
from bubo.engine.stats import EngineCounters

PIECE_S = 0.01


def request(*prompt: int, slot: int | None = None, max_new: int | None = None) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_new_tokens=max_new, slot=slot)


async def generate(engine: FakeEngine, req: GenerationRequest, log: list[str], name: str) -> str:
    text = ""
    async with engine.open_generation(req) as events:
        log.append(f"{name} started")
        async for event in events:
            if isinstance(event, TokenGenerated):
                text += event.text
            elif isinstance(event, GenerationFinished):
                log.append(f"{name} finished")
    return text


class Held:
    """A slot's KV mirror holding *tokens*; notes how many tokens each copy asked for."""

    def __init__(self, tokens: list[int], adapters: AdapterSet = ()) -> None:
        self.tokens = tokens
        self.adapters = adapters  # the LoRA adapter set they were computed under
        self.asked: list[int] = []

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def head(self, n: int) -> list[int]:
        self.asked.append(n)
        return self.tokens[:n]


def pool(n: int, *, similarity: float = 0.1) -> SlotPool:
    totals = EngineCounters()
    return SlotPool([Slot(id=i, n_ctx=100, totals=totals) for i in range(n)], similarity=similarity)


class TestConcurrency:
    async def test_as_many_generations_run_at_once_as_there_are_slots(self, autojump_clock) -> None:
        """Three slots: A, B, C run, D and E wait; D takes the first slot that frees (A's), E the next."""
        lengths = {"A": "a b", "B": "a b c d", "C": "a b c d e f", "D": "a b c d e f g h", "E": "a b"}

        def reply(req: GenerationRequest) -> str:
            return lengths.get("ABCDE"[req.prompt_tokens[0]], "a b")

        engine = FakeEngine(script=FakeScript(reply=reply, piece_delay=PIECE_S), n_slots=3)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            for index, name in enumerate("ABCDE"):
                nursery.start_soon(generate, engine, request(index, 9), log, name)
                await trio.testing.wait_all_tasks_blocked()
            assert log == ["A started", "B started", "C started"]
            assert engine.statistics().requests_processing == 3
            assert engine.statistics().requests_deferred == 2
        assert log.index("A finished") < log.index("D started") < log.index("B finished")
        assert log.index("B finished") < log.index("E started") < log.index("C finished")
        assert engine.slots_used == [0, 1, 2, 0, 1]

    async def test_every_slot_shows_its_own_task(self, autojump_clock) -> None:
        engine = FakeEngine(script=FakeScript(reply="a b c d", piece_delay=PIECE_S), n_slots=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, request(1, 2, 3, max_new=4), [], "A")
            nursery.start_soon(generate, engine, request(7, 8, max_new=4), [], "B")
            await trio.sleep(PIECE_S * 1.5)
            slots = engine.statistics().slots
            assert [slot.is_processing for slot in slots] == [True, True]
            assert sorted(slot.n_prompt_tokens for slot in slots) == [2, 3]
            assert len({slot.id_task for slot in slots}) == 2
            assert all(slot.n_decoded == 1 and slot.n_remain == 3 for slot in slots)
        assert [slot.is_processing for slot in engine.statistics().slots] == [False, False]
        assert engine.statistics().tokens_predicted_total == 8

    async def test_a_client_that_leaves_frees_its_slot_and_no_other(self, autojump_clock) -> None:
        engine = FakeEngine(script=FakeScript(reply="a b c d e f", piece_delay=PIECE_S), n_slots=3)
        texts: dict[str, str] = {}

        async def keep(name: str) -> None:
            texts[name] = await generate(engine, request(1, 2), [], name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep, "A")
            nursery.start_soon(keep, "C")
            with trio.move_on_after(PIECE_S * 2.5):
                await generate(engine, request(1, 2), [], "B")
            assert engine.statistics().requests_processing == 2
            assert engine.cancelled == 1
        assert texts == {"A": "a b c d e f", "C": "a b c d e f"}
        await engine.wait_idle()
        assert engine.statistics().requests_processing == 0


class TestSlotChoice:
    async def test_a_conversation_returns_to_the_slot_holding_its_prefix(self) -> None:
        engine = FakeEngine(n_slots=3)
        first = tuple(range(100, 140))
        other = tuple(range(500, 540))
        await generate(engine, request(*first), [], "A")
        await generate(engine, request(*other), [], "B")
        await generate(engine, request(*first, 1, 2, 3), [], "A again")
        assert engine.slots_used == [0, 1, 0]

    async def test_without_a_similar_prefix_the_least_recently_used_slot(self) -> None:
        engine = FakeEngine(n_slots=2)
        for prompt in ((1, 2), (3, 4), (5, 6), (7, 8)):
            await generate(engine, request(*prompt), [], "x")
        assert engine.slots_used == [0, 1, 0, 1]

    async def test_a_share_at_or_below_the_similarity_falls_back_to_lru(self) -> None:
        slots = pool(2, similarity=0.5)
        slots.slots[0].mirror = Held([1, 2, 9, 9])
        slots.slots[0].last_used = 5
        slots.slots[1].last_used = 1
        assert (await slots.acquire((1, 2, 3, 4))).id == 1  # half the prompt: not more than 0.5
        slots.release(slots.slots[1])
        assert (await slots.acquire((1, 2, 9, 4))).id == 0  # three quarters

    async def test_only_a_prefix_computed_under_the_request_adapters_draws_it(self) -> None:
        slots = pool(2, similarity=0.1)
        slots.slots[0].mirror = Held([1, 2, 3, 4], adapters=((0, 1.0),))
        slots.slots[0].last_used = 5
        slots.slots[1].last_used = 1
        assert (await slots.acquire((1, 2, 3, 4, 5))).id == 1  # the base model's: not slot 0's prefix
        slots.release(slots.slots[1])
        assert (await slots.acquire((1, 2, 3, 4, 5), adapters=((0, 1.0),))).id == 0

    async def test_a_conversation_under_other_adapters_reuses_nothing(self) -> None:
        engine = FakeEngine(n_slots=1, lora=[LoraAdapter(id=0, path="a.gguf", scale=0.0)])
        prompt = tuple(range(100, 140))
        await generate(engine, request(*prompt), [], "A")
        adapted = GenerationRequest(prompt_tokens=(*prompt, 1), max_new_tokens=None, lora=(1.0,))
        await generate(engine, adapted, [], "A")
        assert engine.slots[0].statistics().n_prompt_tokens_cache == 0
        assert engine.slots[0].statistics().lora == (1.0,)
        await generate(engine, request(*prompt, 1, 2), [], "A")  # the base model's prefix is gone too
        assert engine.slots[0].statistics().n_prompt_tokens_cache == 0
        assert engine.slots[0].statistics().lora == (0.0,)

    async def test_a_pinned_request_waits_for_its_slot_and_lets_others_pass(self, autojump_clock) -> None:
        engine = FakeEngine(script=FakeScript(reply="a b c", piece_delay=PIECE_S), n_slots=2)
        log: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate, engine, request(1, slot=0), log, "A on 0")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(generate, engine, request(2, slot=0), log, "B on 0")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(generate, engine, request(3), log, "C anywhere")
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["A on 0 started", "C anywhere started"]
        assert engine.slots_used == [0, 1, 0]


class TestPool:
    async def test_a_waiter_that_leaves_is_forgotten(self) -> None:
        slots = pool(1)
        held = await slots.acquire((1,))
        with trio.move_on_after(0.01):
            await slots.acquire((2,))
        assert slots.waiting == 0
        slots.release(held)
        assert (await slots.acquire((3,))) is held

    async def test_wait_idle_returns_when_the_last_slot_is_given_back(self) -> None:
        slots = pool(2)
        a, b = await slots.acquire((1,)), await slots.acquire((2,))
        done = trio.Event()

        async def wait() -> None:
            await slots.wait_idle()
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            slots.release(a)
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            slots.release(b)
        assert done.is_set()


class TestCounts:
    async def test_the_engines_cheap_counts_agree_with_its_snapshot(self, autojump_clock) -> None:
        engine = FakeEngine(script=FakeScript(reply="a b c d", piece_delay=PIECE_S), n_slots=2)
        log: list[str] = []
        assert (engine.n_slots, engine.requests_running, engine.requests_waiting) == (2, 0, 0)
        async with trio.open_nursery() as nursery:
            for index in range(3):
                nursery.start_soon(generate, engine, request(index, 9), log, str(index))
                await trio.testing.wait_all_tasks_blocked()
            statistics = engine.statistics()
            assert engine.n_slots == len(statistics.slots)
            assert (engine.requests_running, engine.requests_waiting) == (2, 1)
            assert (statistics.requests_processing, statistics.requests_deferred) == (2, 1)
        assert (engine.requests_running, engine.requests_waiting) == (0, 0)

    async def test_the_load_counts_what_runs_and_what_waits(self, autojump_clock) -> None:
        """Cells of running requests only, and the prompt positions nobody has read yet."""
        engine = FakeEngine(script=FakeScript(reply="a b c d", piece_delay=PIECE_S, prefill_delay=PIECE_S))
        await generate(engine, request(*range(40)), [], "warm")  # an idle slot now caches 40 tokens
        statistics = engine.statistics()
        assert (statistics.kv_cache_tokens, statistics.kv_cache_tokens_running) == (40, 0)
        assert (statistics.prompt_tokens_waiting, statistics.kv_cache_running_ratio) == (0, 0.0)
        async with trio.open_nursery() as nursery:
            # the running one shares 30 cached tokens and has 15 to read; 7 wait whole
            nursery.start_soon(generate, engine, request(*range(30), *range(100, 115)), [], "running")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(generate, engine, request(*range(200, 207)), [], "waiting")
            await trio.testing.wait_all_tasks_blocked()
            statistics = engine.statistics()
            assert statistics.prompt_tokens_waiting == 15 + 7
            assert statistics.kv_cache_tokens_running == 40  # its slot's cells, before the prompt is read
            await trio.sleep(PIECE_S * 1.5)  # the prompt is read: nothing of it waits any more
            statistics = engine.statistics()
            assert statistics.prompt_tokens_waiting == 7
            assert statistics.kv_cache_tokens_running == 45
            assert statistics.kv_cache_running_ratio == 45 / statistics.kv_cache_capacity
        statistics = engine.statistics()
        assert (statistics.prompt_tokens_waiting, statistics.kv_cache_tokens_running) == (0, 0)

    def test_a_slots_token_count_is_read_from_its_mirror_without_a_copy(self) -> None:
        mirror = Held(list(range(42)))
        slot = Slot(id=0, n_ctx=100, totals=EngineCounters(), mirror=mirror)
        assert slot.n_cached == 42
        assert slot.statistics().n_prompt_tokens == 42
        assert mirror.asked == []

    async def test_slot_choice_copies_only_the_prompts_length_of_each_slot(self) -> None:
        slots = pool(2)
        mirrors = [Held(list(range(1000))), Held([7] * 1000)]
        for slot, mirror in zip(slots.slots, mirrors, strict=True):
            slot.mirror = mirror
        chosen = await slots.acquire((0, 1, 2, 3))
        assert chosen.id == 0
        assert [m.asked for m in mirrors] == [[4], [4]]
