"""The slot's KV cache: prefix reuse, and host-RAM snapshots of conversations that left it.

Each slot's live sequence keeps its previous request's tokens; a new request reuses
their longest common prefix.  When a request would throw away a substantial
part of the live sequence (another conversation arrives), the live state is
first copied to host RAM (``llama_state_seq_get_data``) as a snapshot.  A later
request restores the snapshot with the longest matching prefix
(``llama_state_seq_set_data``) when it beats the live prefix, so several
interleaved agent conversations each keep their warm prefix.  Snapshots live
under a byte budget, least recently used out first.  With a disk tier
(:mod:`._disk_cache`) every snapshot, and every live sequence once the engine
is idle or closes, is also queued for a file; a request the live sequence and
host RAM serve less well gets the best file read and checked in a worker
thread (:meth:`SequenceCache.read_from_disk`, a :class:`~._kv_plan.DiskOffer`);
the offer travels inside the request's generation to :meth:`SequenceCache.prepare`,
which restores it if it is still the best source.

Which source a prompt starts from is decided by :func:`._kv_plan.choose_source`
over plain values (what each source holds); :meth:`SequenceCache.prepare`
gathers those values, asks for a :class:`~._kv_plan.Plan` and carries it out
with the llama.cpp calls.  The rules are in :mod:`._kv_plan`.

Cells computed under one LoRA adapter set are not what another set computes:
a sequence and each snapshot remember the set they were computed under, and
a prompt reuses only a prefix computed under its own set.

A context shift (:meth:`SequenceCache.shift`) drops tokens from the middle of
the sequence and moves the later cells down; those cells were computed with
the dropped tokens in view, so they are not what evaluating the remaining
tokens afresh gives.  The cache therefore remembers how far its cells are
exact and never reuses (nor snapshots) the rest.

With ``--cache-reuse N`` (llama-server's, off by default) a prompt whose middle
changed keeps more than its common prefix: after the prefix, each run of at
least N cached tokens that the prompt repeats further on is moved to its new
position (``llama_memory_seq_rm`` of the cells between, ``llama_memory_seq_add``
of the run), and only the tokens between the runs are evaluated.  The moved
cells were computed with the old middle in view; llama-server takes them as
they are, and so does Bubo (they count as exact), which is the trade the flag
asks for: greedy output may differ from a cold run's where the changed middle
mattered to the later tokens.  Moved cells are never shared with another
sequence, though (below): they are not what evaluating the prompt gives.

With the unified KV cache a sequence also takes its prefix from another
slot's sequence when that one holds more of it, exactly and at the same
positions: ``llama_memory_seq_cp`` adds the sequence to those cells (shared,
not copied) and only the rest of the prompt is evaluated.  A :class:`CellLedger`
keeps which cells each sequence holds, so that the cells in use count a shared
one once.  Neither a context shift nor ``--cache-reuse`` moves a cell another
sequence holds (a cell has one position for all its sequences): the shift drops
those past ``n_keep`` instead, the reuse moves only runs after them.  Moved
cells become the sequence's own in the ledger, and only the cells before the
first moved one (``n_shareable``) are offered to other sequences; the prefix is
shared only from a sequence under the request's LoRA adapter set.

Only the engine thread that owns the context calls into this module, except
:meth:`SequenceCache.read_from_disk`, which only reads; the snapshot store and
the ledger are shared by every slot's sequence.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import struct
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import llama_cpp

from bubo.domain.generation import CacheReport, CacheTags

from ._cells import CellLedger
from ._disk_cache import DiskTier
from ._kv_plan import (
    MIN_SNAPSHOT_TOKENS,
    Base,
    DiskOffer,
    Held,
    Move,
    Plan,
    Sources,
    choose_source,
    file_pays,
)
from .base import EngineFailure, SnapshotInfo
from .lora import NO_ADAPTERS, AdapterSet
from .slots import common_prefix

__all__ = ["SequenceCache", "SnapshotStore", "saved_token_count"]

_SEQ_HEADER = struct.Struct("<III")  # llama.cpp's sequence state file: magic, version, token count


def saved_token_count(path: Path) -> int | None:
    """The tokens a slot file of this llama.cpp holds, from its header; None if it is not one."""
    try:
        with path.open("rb") as file:
            head = file.read(_SEQ_HEADER.size)
    except OSError:
        return None
    if len(head) < _SEQ_HEADER.size:
        return None
    magic, version, n_tokens = _SEQ_HEADER.unpack(head)
    if (magic, version) != (llama_cpp.LLAMA_STATE_SEQ_MAGIC, llama_cpp.LLAMA_STATE_SEQ_VERSION):
        return None
    return int(n_tokens)


logger = logging.getLogger(__name__)

# Evicted prefixes remembered (to report "evicted" as the reason of a miss).
EVICTED_MEMORY = 64
EVICTED_PREFIX = 256


@attrs.define
class _Snapshot:
    tokens: tuple[int, ...]
    data: ctypes.Array[ctypes.c_uint8]
    tags: CacheTags | None
    adapters: AdapterSet = NO_ADAPTERS
    moved: int | None = None  # the first cell --cache-reuse moved (None: every cell in place)
    last_used: float = attrs.field(factory=time.time)

    @property
    def size(self) -> int:
        return len(self.data)


class SnapshotStore:
    """Sequence-state snapshots in host RAM under a byte budget (LRU)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[int, _Snapshot] = collections.OrderedDict()
        self._ids = itertools.count()
        self._bytes = 0
        self._evicted: collections.deque[tuple[int, ...]] = collections.deque(maxlen=EVICTED_MEMORY)

    @property
    def total_bytes(self) -> int:
        """Bytes held."""
        return self._bytes

    def snapshots(self) -> list[SnapshotInfo]:
        """What is stored, most recently used last.

        Safe to call from another thread than the decode thread: ``list()``
        copies the entries in one C call, which the decode thread cannot
        interleave with (a Python loop over the dict could see it change).
        """
        entries = list(self._entries.values())
        return [
            SnapshotInfo(
                n_tokens=len(s.tokens),
                size_bytes=s.size,
                conversation=s.tags.conversation if s.tags else None,
                last_used=s.last_used,
                tier="ram",
            )
            for s in entries
        ]

    def held(self) -> list[tuple[int, Held]]:
        """Each snapshot's key and what it holds, least recently used first (what the plan chooses from).

        Safe to call from another thread, as :meth:`snapshots` is (the entries are copied in one C call).
        """
        return [(key, Held(s.tokens, s.adapters)) for key, s in list(self._entries.items())]

    def take(self, key: int) -> _Snapshot:
        """The snapshot, marked most recently used."""
        self._entries.move_to_end(key)
        snapshot = self._entries[key]
        snapshot.last_used = time.time()
        return snapshot

    def add(self, snapshot: _Snapshot) -> None:
        """Keep *snapshot*, dropping those it supersedes and the least recently used over budget."""
        superseded = [
            key
            for key, kept in self._entries.items()
            if kept.adapters == snapshot.adapters and snapshot.tokens[: len(kept.tokens)] == kept.tokens
        ]
        for key in superseded:
            self._drop(key, evicted=False)
        if snapshot.size > self.budget_bytes:
            self._remember_evicted(snapshot.tokens)
            return
        self._entries[next(self._ids)] = snapshot
        self._bytes += snapshot.size
        while self._bytes > self.budget_bytes:
            self._drop(next(iter(self._entries)), evicted=True)

    def _drop(self, key: int, *, evicted: bool) -> None:
        snapshot = self._entries.pop(key)
        self._bytes -= snapshot.size
        if evicted:
            self._remember_evicted(snapshot.tokens)

    def _remember_evicted(self, tokens: tuple[int, ...]) -> None:
        self._evicted.append(tokens[:EVICTED_PREFIX])

    def was_evicted(self, prompt: Sequence[int]) -> bool:
        """Whether *prompt* begins like a snapshot that was evicted for room."""
        return any(
            common_prefix(t, prompt, len(t)) >= min(len(t), MIN_SNAPSHOT_TOKENS) for t in self._evicted
        )

    def conversations(self) -> list[CacheTags]:
        """The tags of every stored snapshot."""
        return [s.tags for s in self._entries.values() if s.tags is not None]


class SequenceCache:
    """One sequence of a context (one slot's): its tokens, prefix reuse and snapshots.

    Its token list mirrors what llama.cpp holds in the sequence; the slot reads
    it (:class:`~.slots.TokenMirror`) from the trio thread.
    """

    def __init__(
        self,
        ctx: object,
        memory: object,
        store: SnapshotStore | None,
        seq_id: int = 0,
        *,
        ledger: CellLedger | None = None,
        reuse_chunk: int = 0,
        disk: DiskTier | None = None,
    ) -> None:
        """*ledger*: the cells of every sequence of the context (one of its own when not given).

        *reuse_chunk*: the shortest cached run moved to its place after a changed middle (0: none).
        """
        self._ctx = ctx
        self._memory = memory
        self.seq_id = seq_id
        self.store = store
        self.reuse_chunk = reuse_chunk
        self.ledger = ledger if ledger is not None else CellLedger()
        self.peers: Sequence[SequenceCache] = ()  # the sequences it may share cells with (a unified cache)
        self.disk = disk
        self.tokens: list[int] = []
        self.tags: CacheTags | None = None
        self.adapters: AdapterSet = NO_ADAPTERS  # the LoRA adapter set its cells were computed under
        self.version = 0  # changes whenever the sequence does (idle work checks it is still current)
        self._ever_used = False
        self._exact: int | None = None  # after a shift: how many leading cells are exact (None: all)
        self._moved: int | None = None  # the first cell --cache-reuse moved (None: every cell in place)

    @property
    def n_tokens(self) -> int:
        """How many tokens are held (safe to read from another thread: the list's length, no copy)."""
        return len(self.tokens)

    def head(self, n: int) -> list[int]:
        """The first *n* tokens held, copied in one C call (safe to read from another thread)."""
        return self.tokens[:n]

    def extend(self, tokens: Sequence[int]) -> None:
        """Record *tokens* as evaluated after the cached ones."""
        self.tokens.extend(tokens)
        self.ledger.extend(self.seq_id, len(tokens))
        self.version += 1

    @property
    def private_cells(self) -> int:
        """Cells no other sequence holds: what giving this one up frees."""
        return self.ledger.private(self.seq_id)

    @property
    def n_exact(self) -> int:
        """How many leading cells are exact (all, unless a context shift moved some)."""
        return len(self.tokens) if self._exact is None else self._exact

    @property
    def n_shareable(self) -> int:
        """How many leading cells another sequence may share: exact, and none moved by ``--cache-reuse``."""
        return self.n_exact if self._moved is None else min(self.n_exact, self._moved)

    @property
    def shifted(self) -> bool:
        """Whether a context shift left cells that are not exact (they are dropped before reuse)."""
        return self._exact is not None

    def prepare(
        self,
        prompt: Sequence[int],
        tags: CacheTags | None,
        *,
        reuse: bool = True,
        adapters: AdapterSet = NO_ADAPTERS,
        offer: DiskOffer | None = None,
    ) -> tuple[int, CacheReport]:
        """Make the sequence hold the longest cached prefix of *prompt*; return its length and a report.

        At least the last prompt token is always left to evaluate: sampling needs its logits.
        Without *reuse* (llama-server's ``cache_prompt: false``) nothing cached is reused: the
        whole prompt is evaluated afresh (the live sequence is still kept as a snapshot if worth one).
        Only a prefix computed under *adapters* (the request's LoRA adapter set) is reused.
        *offer*: the file :meth:`read_from_disk` read for this request, restored if still the best.

        The cells a context shift moved are dropped first; then :func:`._kv_plan.choose_source`
        decides from what each source holds, and :meth:`_carry_out` makes the llama.cpp calls.
        """
        self._drop_inexact()
        sources = Sources(
            live=Held(self.tokens, self.adapters),
            pinned=self.ledger.shared_end(self.seq_id, 0),
            peers=[
                (peer.seq_id, Held(peer.tokens, peer.adapters, usable=peer.n_shareable))
                for peer in self.peers
                if peer is not self
            ],
            snapshots=self.store.held() if self.store is not None else (),
            offer=Held(offer.tokens, offer.adapters) if offer is not None else None,
            can_shift=self.can_shift(),
        )
        plan = choose_source(prompt, adapters, sources, reuse=reuse, reuse_chunk=self.reuse_chunk)
        keep, restored, shared = self._carry_out(plan, prompt, offer)
        if plan.disabled:
            report = CacheReport(hit=False, miss_reason="disabled")
        else:
            report = self._report(prompt, tags, keep, plan.skipped, restored, shared)
        self.tags, self.adapters = tags, adapters
        self._ever_used = True
        return keep, report

    def _carry_out(self, plan: Plan, prompt: Sequence[int], offer: DiskOffer | None) -> tuple[int, int, int]:
        """Make the calls *plan* asks for; ``(tokens held, bytes restored, tokens shared)``.

        A restore llama.cpp refuses leaves the sequence empty (nothing else is done).  A
        truncation the memory cannot make (recurrent state) clears it, and a share then
        starts at 0.
        """
        restoring: _Snapshot | None = None
        if plan.base is Base.SNAPSHOT:
            assert self.store is not None
            assert plan.snapshot_key is not None
            restoring = self.store.take(plan.snapshot_key)  # held first: saving the live may evict it
        elif plan.base is Base.DISK:
            assert offer is not None
            data = (ctypes.c_uint8 * len(offer.payload)).from_buffer(offer.payload)
            restoring = _Snapshot(tokens=offer.tokens, data=data, tags=None, adapters=offer.adapters)
        if plan.save_live:
            self._save_live()
        restored = shared = 0
        if restoring is not None:
            restored = self._load(restoring)
            if not restored:
                return 0, 0, 0
            if plan.base is Base.DISK:
                logger.info("restored %d tokens of the prompt cache from disk", plan.keep)
        if plan.share is not None:
            keep = self.truncate(plan.keep)
            peer = next(p for p in self.peers if p.seq_id == plan.share.seq_id)
            shared = self._share(peer, keep, plan.share.end, prompt)
            return keep + shared, restored, shared
        if plan.moves:
            return self._move(plan.moves, prompt, plan.keep), restored, shared
        return self.truncate(plan.keep), restored, shared

    def _move(self, moves: Sequence[Move], prompt: Sequence[int], keep: int) -> int:
        """Move the runs ``--cache-reuse`` found after the first *keep* cells into place; the count held.

        Each run's cells move down to their place in the prompt (``llama_memory_seq_rm`` of the
        cells between, ``llama_memory_seq_add`` of the run); the cells after the last go.  The
        moved cells become the sequence's own and are never shared.
        """
        for move in moves:
            llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, move.to, move.start)
            llama_cpp.llama_memory_seq_add(
                self._memory, self.seq_id, move.start, move.end, move.to - move.start
            )
        held = moves[-1].to + moves[-1].end - moves[-1].start
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, held, -1)
        logger.debug("cache reuse: %d tokens moved after a %d-token prefix", held - keep, keep)
        self.tokens[:] = prompt[:held]
        self.ledger.moved(self.seq_id, keep, held - keep)
        self._moved = keep if self._moved is None else min(self._moved, keep)
        self.version += 1
        return held

    def _share(self, peer: SequenceCache, start: int, end: int, prompt: Sequence[int]) -> int:
        """Take *peer*'s cells ``[start, end)`` (this sequence holds ``[0, start)``); how many it took.

        The cells gain this sequence's id (``llama_memory_seq_cp`` on a unified cache), nothing is copied.
        """
        llama_cpp.llama_memory_seq_cp(self._memory, peer.seq_id, self.seq_id, start, end)
        self.tokens.extend(prompt[start:end])
        self.ledger.share(peer.seq_id, self.seq_id, start, end)
        self.version += 1
        return end - start

    def _report(
        self,
        prompt: Sequence[int],
        tags: CacheTags | None,
        keep: int,
        partial: int,
        restored: int,
        shared: int,
    ) -> CacheReport:
        """A hit reuses a real part of the prompt: 64 tokens, or half of a shorter prompt.

        Sharing only a chat template's first few tokens is still a miss, with its reason.
        """
        facts = {"snapshots_skipped": partial, "restored_bytes": restored, "shared_tokens": shared}
        if keep and keep >= min(MIN_SNAPSHOT_TOKENS, len(prompt) // 2):
            return CacheReport(hit=True, miss_reason=None, **facts)
        return CacheReport(hit=False, miss_reason=self._miss_reason(prompt, tags), **facts)

    def _miss_reason(self, prompt: Sequence[int], tags: CacheTags | None) -> str:
        known = ([self.tags] if self.tags else []) + (self.store.conversations() if self.store else [])
        if tags is not None and any(
            t.conversation == tags.conversation and t.template != tags.template for t in known
        ):
            return "template_changed"
        if self.store is not None and self.store.was_evicted(prompt):
            return "evicted"
        if not self._ever_used:
            return "cold"
        if self.store is None and self.disk is None:
            return "disabled"
        return "no_prefix"

    def _save_live(self) -> None:
        """Copy the live sequence to host RAM (and queue it for disk) before it is overwritten.

        A sequence with cells ``--cache-reuse`` moved is not written to disk: a file records no
        moved cells, and its restored cells are offered to other slots as evaluated in place.
        """
        if len(self.tokens) < MIN_SNAPSHOT_TOKENS:
            return
        on_disk = self.disk is None or self._moved is not None or self.disk.holds(self.tokens, self.adapters)
        if self.store is None and on_disk:
            return
        data = self._state()
        if data is None:
            return
        if self.store is not None:
            self.store.add(
                _Snapshot(
                    tokens=tuple(self.tokens),
                    data=data,
                    tags=self.tags,
                    adapters=self.adapters,
                    moved=self._moved,
                )
            )
        if not on_disk:
            assert self.disk is not None
            self.disk.put(self.tokens, memoryview(data), self.adapters)

    def persist(self) -> None:
        """Queue the live sequence for disk, unless it is there already (the engine is idle or closing)."""
        disk = self.disk
        if disk is None or self._exact is not None or self._moved is not None:
            return
        if len(self.tokens) < MIN_SNAPSHOT_TOKENS:
            return
        if disk.holds(self.tokens, self.adapters):
            return
        data = self._state()
        if data is not None:
            disk.put(self.tokens, memoryview(data), self.adapters)

    def _state(self) -> ctypes.Array[ctypes.c_uint8] | None:
        """A copy of the sequence's state in host memory (None if llama.cpp could not write it)."""
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, self.seq_id))
        data: ctypes.Array[ctypes.c_uint8] = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, data, size, self.seq_id)
        if written != size:
            logger.warning("could not snapshot the sequence state (%d of %d bytes)", written, size)
            return None
        return data

    def read_from_disk(
        self, prompt: Sequence[int], max_tokens: int, adapters: AdapterSet = NO_ADAPTERS
    ) -> DiskOffer | None:
        """The disk's best file for *prompt*, read and checked, if it beats what is here; else None.

        Only a file computed under *adapters* (the request's LoRA adapter set) counts, and only
        the live sequence, another slot's shareable prefix and snapshots under that set are what
        it must beat (a sub-agent whose prefix another slot holds reads no file).  Those are read
        here from another thread as copies; a race only makes the guess stale, and
        :meth:`prepare` chooses again on the decode thread.

        Runs in a worker thread before the generation is submitted (the decode thread never waits on
        the disk) and writes nothing the decode thread reads: the caller hands the offer to the
        request's generation, whose :meth:`prepare` gets it as an argument.  A file is read
        only if it beats the slots and host RAM by :data:`._kv_plan.MIN_RESTORE_GAIN` tokens
        (:func:`._kv_plan.file_pays`); one that fails its checks is not offered.
        """
        if self.disk is None:
            return None
        entry, match = self.disk.best(prompt, adapters, max_tokens=max_tokens)
        if entry is None:
            return None
        held = [
            Held(cache.head(len(prompt)), cache.adapters, usable=None if cache is self else cache.n_shareable)
            for cache in self.peers or (self,)  # the peers of a unified cache include this sequence
        ]
        if self.store is not None:
            held += [snapshot for _, snapshot in self.store.held()]
        if not file_pays(prompt, adapters, match, held):
            return None
        payload = self.disk.read(entry)
        if payload is None:
            return None
        return DiskOffer(tokens=tuple(entry.tokens), adapters=entry.adapters, payload=payload)

    def _load(self, snapshot: _Snapshot) -> int:
        """Load *snapshot* into the sequence; return its size (0 if llama.cpp refused it)."""
        self.clear()
        read = llama_cpp.llama_state_seq_set_data(self._ctx, snapshot.data, snapshot.size, self.seq_id)
        if read != snapshot.size:
            logger.warning("could not restore a sequence snapshot (%d of %d bytes)", read, snapshot.size)
            self.clear()
            return 0
        self.tokens = list(snapshot.tokens)
        self.ledger.replace(self.seq_id, len(self.tokens))
        self.tags, self.adapters = snapshot.tags, snapshot.adapters
        self._moved = snapshot.moved
        self._exact = None
        self.version += 1
        return snapshot.size

    def save_file(self, path: Path) -> int:
        """Write the sequence's state and tokens to *path* (llama.cpp's format); return the bytes written.

        Cells a context shift moved are dropped first: a restored file's cells are all taken as exact.

        Raises:
            EngineFailure: llama.cpp could not write it.

        """
        self._drop_inexact()
        tokens = (llama_cpp.llama_token * len(self.tokens))(*self.tokens)
        written = llama_cpp.llama_state_seq_save_file(
            self._ctx, str(path).encode(), self.seq_id, tokens, len(self.tokens)
        )
        if written == 0:
            raise EngineFailure(f"llama.cpp could not save the slot to {path.name}")
        return int(written)

    def load_file(self, path: Path, capacity: int) -> int:
        """Replace the sequence with the state saved in *path*; return the bytes read.

        The tokens saved with it become the sequence's tokens (the prefix the next request reuses).

        Raises:
            EngineFailure: llama.cpp could not read it (not a state file, another shape of model,
                more than *capacity* tokens); the sequence is then empty.

        """
        self.clear()
        tokens = (llama_cpp.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        read = llama_cpp.llama_state_seq_load_file(
            self._ctx, str(path).encode(), self.seq_id, tokens, capacity, ctypes.byref(count)
        )
        if read == 0:
            self.clear()
            raise EngineFailure(f"llama.cpp could not restore the slot from {path.name}")
        self.tokens = list(tokens[: count.value])
        self.ledger.replace(self.seq_id, len(self.tokens))
        self.tags = None
        self.version += 1
        return int(read)

    def truncate(self, keep: int) -> int:
        """Drop everything after the first *keep* tokens; return how many remain."""
        if keep < len(self.tokens) and not llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, keep, -1):
            self.clear()  # this memory cannot drop a suffix (recurrent state): start afresh
            return 0
        if keep < len(self.tokens):
            del self.tokens[keep:]
            self.ledger.truncate(self.seq_id, keep)
            self.version += 1
        if self._exact is not None and self._exact >= len(self.tokens):
            self._exact = None
        if self._moved is not None and self._moved >= len(self.tokens):
            self._moved = None
        return len(self.tokens)

    def can_shift(self) -> bool:
        """Whether this memory can move cells to other positions (not a recurrent or sliding-window one)."""
        return bool(llama_cpp.llama_memory_can_shift(self._memory))

    def shift(self, n_keep: int, n_discard: int) -> int:
        """Drop *n_discard* tokens after the first *n_keep*; move the later cells down to close the gap.

        Return how many were dropped: more than asked when a cell to move is
        shared with another sequence (a cell has one position for all its
        sequences), then every cell up to the last shared one goes.  The first
        *n_keep* cells stay exact; the moved ones are not (see the module's docstring).
        """
        n_past = len(self.tokens)
        if n_keep < 0 or not 0 < n_discard <= n_past - n_keep:
            raise ValueError(f"cannot discard {n_discard} of {n_past} tokens after the first {n_keep}")
        n_discard = max(n_discard, self.ledger.shared_end(self.seq_id, n_keep + n_discard) - n_keep)
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, n_keep, n_keep + n_discard)
        llama_cpp.llama_memory_seq_add(self._memory, self.seq_id, n_keep + n_discard, n_past, -n_discard)
        del self.tokens[n_keep : n_keep + n_discard]
        self.ledger.shift(self.seq_id, n_keep, n_discard)
        self._exact = n_keep if self._exact is None else min(self._exact, n_keep)
        self.version += 1
        return n_discard

    def _drop_inexact(self) -> None:
        """Forget the cells a shift moved: they must not be reused as if evaluated in place."""
        if self._exact is not None:
            self.truncate(self._exact)
            self._exact = None

    def evict(self) -> None:
        """Give the sequence's cells up (the shared context is full), keeping a snapshot worth one."""
        self._drop_inexact()
        self._save_live()
        self.clear()

    def park(self) -> None:
        """Move an idle sequence to a host-RAM snapshot and give its cells up, if host RAM can hold it.

        A sequence larger than the whole snapshot budget stays where it is: parking it would lose it.
        """
        if self.store is None:
            return
        if int(llama_cpp.llama_state_seq_get_size(self._ctx, self.seq_id)) > self.store.budget_bytes:
            return
        self.evict()

    def discard_uncommitted(self) -> None:
        """Drop whatever lies past the recorded tokens (a failed batch may have written some)."""
        if not llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, len(self.tokens), -1):
            self.clear()

    def clear(self) -> None:
        """Forget the whole sequence."""
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, -1, -1)
        self.tokens.clear()
        self.ledger.truncate(self.seq_id, 0)
        self._exact = None
        self._moved = None
        self.version += 1
