"""The prompt cache's choice of source (``_kv_plan.choose_source``), without a model.

The property tests draw random histories (the live sequence, other slots'
sequences, host-RAM snapshots, a disk offer, each under one of two adapter
sets, and a prompt made from one of them) and carry the plan out on a model of
llama.cpp's sequence: a map from positions to the cells there.  Whatever the
plan, the cells the sequence ends with are the prompt's tokens, computed under
the request's adapter set, and the plan reuses at least what the live
sequence or another slot offers, and every restore that pays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubo.engine._kv_plan import (
    MIN_RESTORE_GAIN,
    MIN_SNAPSHOT_TOKENS,
    Base,
    Held,
    Move,
    Plan,
    Share,
    Sources,
    choose_source,
    chunk_moves,
    file_pays,
)
from bubo.engine.lora import NO_ADAPTERS, AdapterSet

LORA: AdapterSet = ((0, 1.0),)
SETS = (NO_ADAPTERS, LORA)


def choose(prompt: Sequence[int], adapters: AdapterSet, *, reuse_chunk: int = 0, **sources: Any) -> Plan:
    """The plan for *prompt* from the *sources* named."""
    return choose_source(prompt, adapters, Sources(**sources), reuse_chunk=reuse_chunk)


@attrs.frozen
class Cell:
    """What a KV cell holds: the token evaluated there, under which adapter set."""

    token: int
    adapters: AdapterSet


@attrs.frozen
class History:
    """Everything the choice reads, drawn at random."""

    prompt: tuple[int, ...]
    adapters: AdapterSet
    live: Held
    pinned: int
    peers: tuple[tuple[int, Held], ...]
    snapshots: tuple[tuple[int, Held], ...]
    offer: Held | None
    reuse_chunk: int
    can_shift: bool

    def plan(self) -> Plan:
        return choose(
            self.prompt,
            self.adapters,
            live=self.live,
            pinned=self.pinned,
            peers=self.peers,
            snapshots=self.snapshots,
            offer=self.offer,
            reuse_chunk=self.reuse_chunk,
            can_shift=self.can_shift,
        )

    def matches(self, held: Held) -> int:
        return held.match(self.prompt, self.adapters)


def cells(held: Held) -> dict[int, Cell]:
    return {at: Cell(token, held.adapters) for at, token in enumerate(held.tokens)}


def carry_out(history: History, plan: Plan) -> dict[int, Cell]:
    """The sequence's cells after *plan*, as llama.cpp's memory calls leave them."""
    if plan.base is Base.SNAPSHOT:
        held = dict(history.snapshots)[plan.snapshot_key]  # type: ignore[index]
        pinned = 0  # a restored sequence's cells are its own
    elif plan.base is Base.DISK:
        assert history.offer is not None
        held, pinned = history.offer, 0
    else:
        held, pinned = history.live, history.pinned
    memory = cells(held)
    if not plan.moves:
        memory = {at: cell for at, cell in memory.items() if at < plan.keep}  # llama_memory_seq_rm(keep, -1)
    if plan.share is not None:
        peer = dict(history.peers)[plan.share.seq_id]
        assert peer.usable is None or plan.share.end <= peer.usable, "shared a cell the peer does not offer"
        for at in range(plan.keep, plan.share.end):  # llama_memory_seq_cp
            memory[at] = Cell(peer.tokens[at], peer.adapters)
    for move in plan.moves:
        assert move.start >= pinned, "moved a cell another sequence holds"
        assert plan.keep <= move.to < move.start < move.end
        memory = {at: cell for at, cell in memory.items() if not move.to <= at < move.start}
        memory = {
            at - (move.start - move.to) if move.start <= at < move.end else at: c for at, c in memory.items()
        }
    if plan.moves:
        memory = {at: cell for at, cell in memory.items() if at < plan.n_cached}
    return memory


@st.composite
def token_lists(draw: st.DrawFn, max_size: int = 160) -> list[int]:
    # two tokens: long common prefixes, repeated runs
    return draw(st.lists(st.integers(0, 1), max_size=max_size))


@st.composite
def derived(draw: st.DrawFn, tokens: Sequence[int]) -> list[int]:
    """A prompt made from *tokens*: cut, continued, with a middle dropped or replaced."""
    tokens = list(tokens)
    cut = draw(st.integers(0, len(tokens)))
    if draw(st.booleans()) and cut < len(tokens):  # a middle dropped (what --cache-reuse serves)
        end = draw(st.integers(cut, len(tokens)))
        tokens = tokens[:cut] + tokens[end:]
    else:
        tokens = tokens[:cut]
    return tokens + draw(token_lists(max_size=40))


@st.composite
def histories(draw: st.DrawFn) -> History:
    adapter_sets = st.sampled_from(SETS)
    live_tokens = draw(token_lists())
    live = Held(live_tokens, draw(adapter_sets))
    peers = []
    for seq_id in range(1, draw(st.integers(0, 3)) + 1):
        tokens = draw(token_lists())
        peers.append((seq_id, Held(tokens, draw(adapter_sets), usable=draw(st.integers(0, len(tokens))))))
    snapshots = [
        (key, Held(draw(token_lists()), draw(adapter_sets))) for key in range(draw(st.integers(0, 3)))
    ]
    offer = Held(draw(token_lists()), draw(adapter_sets)) if draw(st.booleans()) else None
    sources = [live, *(h for _, h in peers), *(h for _, h in snapshots), *([offer] if offer else [])]
    prompt = draw(derived(draw(st.sampled_from(sources)).tokens))
    return History(
        prompt=tuple(prompt),
        adapters=draw(adapter_sets),
        live=live,
        pinned=draw(st.integers(0, len(live_tokens))),
        peers=tuple(peers),
        snapshots=tuple(snapshots),
        offer=offer,
        reuse_chunk=draw(st.sampled_from([0, 1, 2, 3, 8])),
        can_shift=draw(st.booleans()),
    )


class TestEveryPlan:
    @settings(max_examples=400, deadline=None)
    @given(histories())
    def test_holds_the_prompt_s_tokens_computed_under_its_adapter_set(self, history: History) -> None:
        plan = history.plan()
        memory = carry_out(history, plan)
        assert sorted(memory) == list(range(plan.n_cached))
        assert [memory[at].token for at in range(plan.n_cached)] == list(history.prompt[: plan.n_cached])
        assert all(cell.adapters == history.adapters for cell in memory.values())

    @settings(max_examples=400, deadline=None)
    @given(histories())
    def test_leaves_the_prompt_s_last_token_to_evaluate(self, history: History) -> None:
        assert history.plan().n_cached <= max(0, len(history.prompt) - 1)

    @settings(max_examples=400, deadline=None)
    @given(histories())
    def test_reuses_at_least_what_the_live_sequence_or_another_slot_offers(self, history: History) -> None:
        here = max([history.matches(history.live), *(history.matches(h) for _, h in history.peers)])
        assert history.plan().n_cached >= here

    @settings(max_examples=400, deadline=None)
    @given(histories())
    def test_restores_exactly_when_a_state_beats_the_slots_by_the_gain(self, history: History) -> None:
        plan = history.plan()
        here = max([history.matches(history.live), *(history.matches(h) for _, h in history.peers)])
        restorable = [history.matches(h) for _, h in history.snapshots]
        restorable += [history.matches(history.offer)] if history.offer is not None else []
        best = max(restorable, default=0)
        assert (plan.base is not Base.LIVE) == (best >= here + MIN_RESTORE_GAIN)
        if plan.base is not Base.LIVE:
            assert plan.keep == best  # the longest restore, whichever tier holds it

    @settings(max_examples=400, deadline=None)
    @given(histories())
    def test_keeps_the_live_sequence_before_losing_a_snapshot_s_worth(self, history: History) -> None:
        plan = history.plan()
        lost = len(history.live.tokens) - history.matches(history.live)
        assert plan.save_live == (plan.base is not Base.LIVE or lost >= MIN_SNAPSHOT_TOKENS)

    @settings(max_examples=400, deadline=None)
    @given(histories())
    def test_shares_only_to_take_at_least_one_cell(self, history: History) -> None:
        plan = history.plan()
        assert plan.share is None or plan.share.end > plan.keep

    @settings(max_examples=200, deadline=None)
    @given(histories())
    def test_without_reuse_holds_nothing_and_keeps_the_live_sequence(self, history: History) -> None:
        sources = Sources(live=history.live, peers=history.peers, snapshots=history.snapshots)
        plan = choose_source(history.prompt, history.adapters, sources, reuse=False)
        assert (plan.n_cached, plan.save_live, plan.disabled, plan.base) == (0, True, True, Base.LIVE)


def prompt_of(n: int, *, start: int = 1000) -> tuple[int, ...]:
    return tuple(range(start, start + n))


PROMPT = prompt_of(200)


class TestTies:
    def test_the_least_recently_used_of_equal_snapshots_is_restored(self) -> None:
        snapshots = [(7, Held(PROMPT[:100])), (3, Held(PROMPT[:100])), (5, Held(PROMPT[:50]))]
        plan = choose(PROMPT, NO_ADAPTERS, live=Held(()), snapshots=snapshots)
        assert (plan.base, plan.snapshot_key, plan.keep, plan.skipped) == (Base.SNAPSHOT, 7, 100, 2)

    def test_a_snapshot_wins_a_tie_with_the_disk_offer(self) -> None:
        plan = choose(
            PROMPT, NO_ADAPTERS, live=Held(()), snapshots=[(1, Held(PROMPT[:100]))], offer=Held(PROMPT[:100])
        )
        assert (plan.base, plan.snapshot_key) == (Base.SNAPSHOT, 1)

    def test_the_disk_offer_wins_by_one_token_over_a_snapshot(self) -> None:
        plan = choose(
            PROMPT, NO_ADAPTERS, live=Held(()), snapshots=[(1, Held(PROMPT[:100]))], offer=Held(PROMPT[:101])
        )
        assert (plan.base, plan.snapshot_key, plan.keep) == (Base.DISK, None, 101)

    def test_the_first_of_equal_peers_is_shared(self) -> None:
        peers = [(2, Held(PROMPT[:80])), (1, Held(PROMPT[:80]))]
        plan = choose(PROMPT, NO_ADAPTERS, live=Held(PROMPT[:10]), peers=peers)
        assert (plan.base, plan.keep, plan.share) == (Base.LIVE, 10, Share(2, 80))


class TestTheGain:
    @pytest.mark.parametrize("tier", ["snapshot", "disk"])
    def test_a_restore_must_beat_the_live_prefix_by_the_gain(self, tier: str) -> None:
        live = Held(PROMPT[:60])
        for extra, restored in ((MIN_RESTORE_GAIN - 1, False), (MIN_RESTORE_GAIN, True)):
            state = Held(PROMPT[: 60 + extra])
            plan = choose(
                PROMPT,
                NO_ADAPTERS,
                live=live,
                snapshots=[(0, state)] if tier == "snapshot" else [],
                offer=state if tier == "disk" else None,
            )
            assert (plan.base is not Base.LIVE) == restored
            assert plan.n_cached == (60 + extra if restored else 60)

    def test_a_restore_must_beat_another_slot_s_prefix_by_the_gain(self) -> None:
        plan = choose(
            PROMPT,
            NO_ADAPTERS,
            live=Held(()),
            peers=[(1, Held(PROMPT[:100]))],
            snapshots=[(0, Held(PROMPT[:120]))],
        )
        assert (plan.base, plan.share, plan.skipped) == (Base.LIVE, Share(1, 100), 1)

    def test_another_slot_offers_only_its_usable_cells(self) -> None:
        plan = choose(PROMPT, NO_ADAPTERS, live=Held(()), peers=[(1, Held(PROMPT[:100], usable=40))])
        assert plan.share == Share(1, 40)


class TestKeepingTheLiveSequence:
    @pytest.mark.parametrize(
        ("lost", "saved"), [(MIN_SNAPSHOT_TOKENS - 1, False), (MIN_SNAPSHOT_TOKENS, True)]
    )
    def test_only_when_the_prompt_would_lose_a_snapshot_s_worth(self, lost: int, saved: bool) -> None:
        live = Held((*PROMPT[:10], *prompt_of(lost, start=0)))
        plan = choose(PROMPT, NO_ADAPTERS, live=live)
        assert (plan.keep, plan.save_live) == (10, saved)


class TestAdapterSets:
    def test_a_live_sequence_of_another_set_is_neither_reused_nor_moved(self) -> None:
        live = Held(PROMPT[:150], LORA)
        plan = choose(PROMPT, NO_ADAPTERS, live=live, reuse_chunk=4)
        assert (plan.keep, plan.moves, plan.save_live) == (0, (), True)

    def test_no_source_of_another_set_counts(self) -> None:
        plan = choose(
            PROMPT,
            LORA,
            live=Held(()),
            peers=[(1, Held(PROMPT))],
            snapshots=[(0, Held(PROMPT))],
            offer=Held(PROMPT),
        )
        assert plan == Plan()


class TestChunkReuse:
    def test_a_dropped_middle_moves_the_rest_into_place(self) -> None:
        cached = PROMPT[:150]
        prompt = (*PROMPT[:50], *PROMPT[70:150], 7)  # 20 tokens dropped, one new at the end
        plan = choose(prompt, NO_ADAPTERS, live=Held(cached), reuse_chunk=4)
        assert (plan.keep, plan.moves, plan.n_cached) == (50, (Move(70, 150, 50),), 130)

    def test_the_prompt_s_last_token_is_never_moved_over(self) -> None:
        prompt = (*PROMPT[:50], *PROMPT[70:150])
        assert chunk_moves(PROMPT[:150], prompt, 50, pinned=0, chunk=4) == (Move(70, 149, 50),)

    def test_runs_shorter_than_the_chunk_stay_behind(self) -> None:
        cached = (*PROMPT[:50], 1, 2, 3, 9, 9, 4, 5, 6, 7, 8)
        prompt = (*PROMPT[:50], 1, 2, 3, 4, 5, 6, 7, 8, 0)
        assert chunk_moves(cached, prompt, 53, pinned=0, chunk=6) == ()
        assert chunk_moves(cached, prompt, 53, pinned=0, chunk=5) == (Move(55, 60, 53),)

    def test_cells_another_sequence_holds_never_move(self) -> None:
        cached = PROMPT[:150]
        prompt = (*PROMPT[:50], *PROMPT[70:150], 7)
        plan = choose(prompt, NO_ADAPTERS, live=Held(cached), pinned=70, reuse_chunk=4)
        assert plan.moves == (Move(70, 150, 50),)
        plan = choose(prompt, NO_ADAPTERS, live=Held(cached), pinned=80, reuse_chunk=4)
        assert (plan.moves, plan.n_cached) == ((), 50)  # the run starts among the pinned cells

    def test_a_memory_that_cannot_move_cells_keeps_the_prefix(self) -> None:
        prompt = (*PROMPT[:50], *PROMPT[70:150], 7)
        plan = choose(prompt, NO_ADAPTERS, live=Held(PROMPT[:150]), reuse_chunk=4, can_shift=False)
        assert (plan.moves, plan.n_cached) == ((), 50)

    def test_a_longer_prefix_of_another_slot_is_shared_instead(self) -> None:
        prompt = (*PROMPT[:50], *PROMPT[70:150], 7)
        peers = [(1, Held(prompt[:60]))]
        plan = choose(prompt, NO_ADAPTERS, live=Held(PROMPT[:150]), peers=peers, reuse_chunk=4)
        assert (plan.share, plan.moves) == (Share(1, 60), ())

    def test_runs_of_a_restored_snapshot_move_too(self) -> None:
        prompt = (*PROMPT[:50], *PROMPT[70:150], 7)
        plan = choose(
            prompt, NO_ADAPTERS, live=Held(()), snapshots=[(0, Held(PROMPT[:150]))], pinned=100, reuse_chunk=4
        )
        assert (plan.base, plan.moves) == (Base.SNAPSHOT, (Move(70, 150, 50),))  # the live's pin is not its


class TestReadingAFile:
    def test_pays_only_by_the_gain_over_every_slot_and_snapshot(self) -> None:
        held = [Held(PROMPT[:40]), Held(PROMPT[:70], usable=100), Held(PROMPT[:50])]
        assert not file_pays(PROMPT, NO_ADAPTERS, 70 + MIN_RESTORE_GAIN - 1, held)
        assert file_pays(PROMPT, NO_ADAPTERS, 70 + MIN_RESTORE_GAIN, held)

    def test_counts_only_what_may_be_reused_under_the_request_s_set(self) -> None:
        held = [Held(PROMPT[:150], LORA), Held(PROMPT[:150], usable=20)]
        assert file_pays(PROMPT, NO_ADAPTERS, 20 + MIN_RESTORE_GAIN, held)
        assert not file_pays(PROMPT, LORA, 20 + MIN_RESTORE_GAIN, held)
