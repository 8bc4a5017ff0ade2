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

import ctypes
import logging
import struct
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from bubo.domain.generation import CacheReport, CacheTags

from ._cells import CellLedger
from ._disk_cache import DiskTier
from ._kv_plan import (
    MIN_SNAPSHOT_TOKENS,
    Base,
    DiskOffer,
    Held,
    Plan,
    Sources,
    choose_source,
    file_pays,
)
from ._kv_tiers import TieredSequence
from ._snapshots import Snapshot, SnapshotStore
from .lora import NO_ADAPTERS, AdapterSet

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


class SequenceCache(TieredSequence):
    """One sequence of a context (one slot's): which cached prefix each prompt starts from.

    Its cells, their token mirror and the calls that change them are
    :class:`~._kv_cells.KvCells`'; their copies in host RAM, on disk and in slot
    files are :class:`~._kv_tiers.TieredSequence`'.  This class gathers what each
    source holds, asks :func:`._kv_plan.choose_source` and carries the plan out,
    and reads a disk file for a request when one pays (in a worker thread).
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
        super().__init__(ctx, memory, seq_id, ledger=ledger, store=store, disk=disk)
        self.reuse_chunk = reuse_chunk
        self.peers: Sequence[SequenceCache] = ()  # the sequences it may share cells with (a unified cache)
        self._ever_used = False

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
        restoring: Snapshot | None = None
        if plan.base is Base.SNAPSHOT:
            assert self.store is not None
            assert plan.snapshot_key is not None
            restoring = self.store.take(plan.snapshot_key)  # held first: saving the live may evict it
        elif plan.base is Base.DISK:
            assert offer is not None
            data = (ctypes.c_uint8 * len(offer.payload)).from_buffer(offer.payload)
            restoring = Snapshot(tokens=offer.tokens, data=data, tags=None, adapters=offer.adapters)
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
