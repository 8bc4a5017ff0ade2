"""``SequenceCache.prepare`` carrying its plan out, on a model of llama.cpp's memory instead of a model's.

The ``llama_memory_*`` and ``llama_state_seq_*`` calls ``_kv_cells`` makes go to
:class:`Memory`: cells with a position, a token, the adapter set that computed
them and the sequences that hold them, as llama.cpp's unified KV cache keeps
them.  Random histories of several slots (prompts made from what they and
their snapshots hold, generated tokens, context shifts, evictions, files
offered from disk) then check the whole cache, plan, executor, ledger and
snapshots together: after every ``prepare`` the sequence holds exactly the
prompt's first tokens, each computed under the request's adapter set, its
token mirror says so, none that a context shift moved, no moved cell is
shared, and no cell another sequence holds was ever moved.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import types
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubo.domain.generation import CacheTags
from bubo.engine import _kv, _kv_cells
from bubo.engine._cells import CellLedger
from bubo.engine._kv_plan import DiskOffer
from bubo.engine.lora import NO_ADAPTERS, AdapterSet

SETS: tuple[AdapterSet, ...] = (NO_ADAPTERS, ((0, 1.0),))
_CELL = struct.Struct("<iiiii")  # position, token, adapter set (index in SETS), moved, shifted


@attrs.define
class Cell:
    """A KV cell: computed for *token* under *adapters*, at *pos* unless it *moved* there since."""

    pos: int
    token: int
    adapters: AdapterSet
    seqs: set[int]
    moved: bool = False  # by --cache-reuse or a context shift: not what evaluating at pos gives
    shifted: bool = False  # by a context shift: never reused


class Memory:
    """llama.cpp's unified KV cache, as far as the prompt cache can tell: cells shared by sequences."""

    def __init__(self) -> None:
        self.cells: dict[int, Cell] = {}
        self._ids = itertools.count()
        self.shifting = False  # the calls come from a context shift

    def held(self, seq: int) -> dict[int, Cell]:
        """The sequence's cells by position (never two at one position)."""
        mine = [cell for cell in self.cells.values() if seq in cell.seqs]
        by_pos = {cell.pos: cell for cell in mine}
        assert len(by_pos) == len(mine), "a sequence holds two cells at one position"
        return by_pos

    def write(
        self,
        seq: int,
        pos: int,
        token: int,
        adapters: AdapterSet,
        *,
        moved: bool = False,
        shifted: bool = False,
    ) -> None:
        """A decode evaluated *token* at *pos* (or a restore put back such a cell)."""
        assert pos not in self.held(seq)
        self.cells[next(self._ids)] = Cell(pos, token, adapters, {seq}, moved, shifted)

    def rm(self, seq: int, p0: int, p1: int) -> bool:
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else 1 << 30)
        for key, cell in list(self.cells.items()):
            if seq in cell.seqs and lo <= cell.pos < hi:
                cell.seqs.discard(seq)
                if not cell.seqs:
                    del self.cells[key]
        return True

    def add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for cell in self.held(seq).values():
            if p0 <= cell.pos < p1:
                assert cell.seqs == {seq}, "moved a cell another sequence holds"
                cell.pos += delta
                cell.moved = True
                cell.shifted |= self.shifting

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        for cell in self.held(src).values():
            if p0 <= cell.pos < p1:
                assert cell.pos not in self.held(dst)
                cell.seqs.add(dst)

    def state(self, seq: int) -> bytes:
        cells = sorted(self.held(seq).values(), key=lambda cell: cell.pos)
        return b"".join(_CELL.pack(c.pos, c.token, SETS.index(c.adapters), c.moved, c.shifted) for c in cells)

    def restore(self, seq: int, data: bytes) -> None:
        self.rm(seq, -1, -1)
        for pos, token, adapters, moved, shifted in _CELL.iter_unpack(data):
            self.write(seq, pos, token, SETS[adapters], moved=bool(moved), shifted=bool(shifted))


def native(memory: Memory) -> types.SimpleNamespace:
    """The ``llama_cpp`` functions ``_kv_cells`` calls, on *memory*."""

    def get_data(_ctx: object, data: Any, size: int, seq: int) -> int:
        state = memory.state(seq)
        ctypes.memmove(data, state, len(state))
        return len(state)

    def set_data(_ctx: object, data: Any, size: int, seq: int) -> int:
        memory.restore(seq, bytes(data)[:size])
        return size

    return types.SimpleNamespace(
        llama_memory_seq_rm=lambda _m, seq, p0, p1: memory.rm(seq, p0, p1),
        llama_memory_seq_add=lambda _m, seq, p0, p1, delta: memory.add(seq, p0, p1, delta),
        llama_memory_seq_cp=lambda _m, src, dst, p0, p1: memory.cp(src, dst, p0, p1),
        llama_memory_can_shift=lambda _m: True,
        llama_state_seq_get_size=lambda _ctx, seq: len(memory.state(seq)),
        llama_state_seq_get_data=get_data,
        llama_state_seq_set_data=set_data,
    )


@attrs.define
class Slots:
    """A context's slots' caches over one :class:`Memory`."""

    memory: Memory
    caches: tuple[_kv.SequenceCache, ...]

    def evaluate(self, seq: int, tokens: list[int], adapters: AdapterSet) -> None:
        """Decode *tokens* after what sequence *seq* holds, as the decode loop does."""
        cache = self.caches[seq]
        for offset, token in enumerate(tokens):
            self.memory.write(seq, len(cache.tokens) + offset, token, adapters)
        cache.extend(tokens)


def make_slots(patch: pytest.MonkeyPatch, n_slots: int, *, ram_bytes: int, reuse_chunk: int) -> Slots:
    """*n_slots* caches sharing one memory, a ledger and (with *ram_bytes*) a snapshot store."""
    memory = Memory()
    patch.setattr(_kv_cells, "llama_cpp", native(memory))
    ledger = CellLedger(range(n_slots))
    store = _kv.SnapshotStore(ram_bytes) if ram_bytes else None
    caches = tuple(
        _kv.SequenceCache(memory, memory, store, seq, ledger=ledger, reuse_chunk=reuse_chunk)
        for seq in range(n_slots)
    )
    for cache in caches:
        cache.peers = caches
    return Slots(memory, caches)


def tokens(max_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, 2), max_size=max_size)


@st.composite
def prompt_from(draw: st.DrawFn, sources: list[list[int]]) -> list[int]:
    """A prompt that begins like one of *sources*, perhaps with a middle dropped, then goes on."""
    base = draw(st.sampled_from(sources))
    cut = draw(st.integers(0, len(base)))
    head = base[:cut]
    if draw(st.booleans()):
        head += base[draw(st.integers(cut, len(base))) :]
    return head + draw(tokens(30).filter(bool))


class TestPrepare:
    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    def test_leaves_exactly_the_prompt_s_prefix_computed_under_its_adapter_set(
        self, data: st.DataObject
    ) -> None:
        with pytest.MonkeyPatch.context() as patch:
            slots = make_slots(
                patch,
                data.draw(st.integers(1, 3), label="slots"),
                ram_bytes=data.draw(st.sampled_from([0, 2_000, 1 << 20]), label="ram"),
                reuse_chunk=data.draw(st.sampled_from([0, 2, 4]), label="reuse_chunk"),
            )
            self.play(slots, data)

    def play(self, slots: Slots, data: st.DataObject) -> None:
        history: list[list[int]] = [data.draw(tokens(150), label="first")]
        for _ in range(data.draw(st.integers(1, 25), label="steps")):
            seq = data.draw(st.integers(0, len(slots.caches) - 1), label="slot")
            cache = slots.caches[seq]
            action = data.draw(st.sampled_from(["prompt", "prompt", "prompt", "shift", "evict"]))
            if action == "shift" and len(cache.tokens) > 1:
                keep = data.draw(st.integers(0, len(cache.tokens) - 2))
                slots.memory.shifting = True
                cache.shift(keep, data.draw(st.integers(1, len(cache.tokens) - keep)))
                slots.memory.shifting = False
                continue
            if action == "evict":
                cache.evict()
                continue
            prompt = data.draw(prompt_from([*history, *(list(c.tokens) for c in slots.caches)]))
            adapters = data.draw(st.sampled_from(SETS))
            offer = None
            if data.draw(st.booleans()):  # a file read from disk for this request
                file_tokens = data.draw(st.sampled_from(history))
                file_set = data.draw(st.sampled_from(SETS))
                state = b"".join(
                    _CELL.pack(pos, token, SETS.index(file_set), 0, 0)
                    for pos, token in enumerate(file_tokens)
                )
                offer = DiskOffer(tokens=tuple(file_tokens), adapters=file_set, payload=bytearray(state))
            keep, report = cache.prepare(
                prompt,
                CacheTags(conversation="c", template="t"),
                reuse=data.draw(st.sampled_from([True, True, True, False]), label="reuse"),
                adapters=adapters,
                offer=offer,
            )
            held = slots.memory.held(seq)
            assert sorted(held) == list(range(keep))
            assert [held[pos].token for pos in range(keep)] == prompt[:keep] == cache.tokens
            assert all(cell.adapters == adapters for cell in held.values())
            assert not any(cell.shifted for cell in held.values()), "reused a cell a context shift moved"
            assert not any(cell.moved and len(cell.seqs) > 1 for cell in held.values()), "shared a moved cell"
            assert keep <= len(prompt) - 1
            assert report.shared_tokens <= keep
            self.check_ledger(slots)
            generated = data.draw(tokens(20), label="generated")
            slots.evaluate(seq, prompt[keep:] + generated, adapters)
            history.append(list(cache.tokens))

    @staticmethod
    def check_ledger(slots: Slots) -> None:
        """The ledger counts the cells the memory holds, and each sequence's private ones."""
        assert slots.caches[0].ledger.used() == len(slots.memory.cells)
        for cache in slots.caches:
            alone = [cell for cell in slots.memory.cells.values() if cell.seqs == {cache.seq_id}]
            assert cache.private_cells == len(alone)

    def test_cells_another_slot_holds_are_not_moved(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            slots = make_slots(patch, 2, ram_bytes=0, reuse_chunk=4)
            first = list(range(100, 200))
            slots.caches[0].prepare(first, None)
            slots.evaluate(0, first, NO_ADAPTERS)
            assert slots.caches[1].prepare([*first, 8], None)[0] == 100  # shared
            slots.evaluate(1, [8], NO_ADAPTERS)
            keep, _ = slots.caches[1].prepare([*first[:30], *first[50:], 7], None)
        assert keep == 30  # the run after the dropped middle is slot 0's too: it stays, and goes
        assert all(cell.seqs == {0, 1} for cell in slots.memory.held(1).values())

    def test_the_snapshot_to_restore_outlives_the_live_sequence_s_save(self) -> None:
        """Host RAM holds one snapshot: saving the live sequence evicts the one being restored."""
        with pytest.MonkeyPatch.context() as patch:
            slots = make_slots(patch, 1, ram_bytes=100 * _CELL.size, reuse_chunk=0)
            cache = slots.caches[0]
            first, other = list(range(100, 200)), list(range(300, 400))
            cache.prepare(first, None)
            slots.evaluate(0, first, NO_ADAPTERS)
            cache.prepare(other, None)  # first goes to host RAM
            slots.evaluate(0, other[:-1], NO_ADAPTERS)
            keep, report = cache.prepare([*first, 7], None)
        assert (keep, report.restored_bytes) == (100, 100 * _CELL.size)
        assert [cell.token for _, cell in sorted(slots.memory.held(0).items())] == first

    def test_a_restore_llama_cpp_refuses_leaves_the_sequence_empty(self) -> None:
        """Nothing planned after the restore is done: no cells moved into an empty sequence."""
        with pytest.MonkeyPatch.context() as patch:
            slots = make_slots(patch, 1, ram_bytes=1 << 20, reuse_chunk=4)
            cache = slots.caches[0]
            first, other = list(range(100, 200)), list(range(300, 400))
            cache.prepare(first, None)
            slots.evaluate(0, first, NO_ADAPTERS)
            cache.prepare(other, None)
            slots.evaluate(0, other[:-1], NO_ADAPTERS)
            patch.setattr(_kv_cells.llama_cpp, "llama_state_seq_set_data", lambda _ctx, _data, _size, _seq: 0)
            keep, report = cache.prepare([*first[:50], *first[70:], 7], None)
        assert (keep, report.restored_bytes, cache.tokens) == (0, 0, [])
        assert slots.memory.held(0) == {}
        self.check_ledger(slots)

    def test_another_slot_shares_only_the_cells_before_those_cache_reuse_moved(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            slots = make_slots(patch, 2, ram_bytes=0, reuse_chunk=4)
            first = list(range(100, 200))
            slots.caches[0].prepare(first, None)
            slots.evaluate(0, first, NO_ADAPTERS)
            trimmed = [*first[:30], *first[50:], 7]  # a middle dropped: the rest moves down
            assert slots.caches[0].prepare(trimmed, None)[0] == 80
            slots.evaluate(0, trimmed[80:], NO_ADAPTERS)
            keep, report = slots.caches[1].prepare([*trimmed, 8], None)
        assert (keep, report.shared_tokens) == (30, 30)
        assert all(len(cell.seqs) == 2 for cell in slots.memory.held(1).values())
