"""A sequence's state copied out of llama.cpp and back: host-RAM snapshots, disk files, slot files.

:class:`TieredSequence` is a slot's :class:`~._kv_cells.KvCells` with the
prompt cache's other tiers.  Before the live cells are overwritten it copies
them to host RAM (:class:`~._snapshots.SnapshotStore`) and queues them for
a file (:class:`~._disk_cache.DiskTier`), and it restores a snapshot or a file
read back when :class:`~._kv.SequenceCache` chooses one; an idle or closing
engine queues the live sequence for disk too.  Slot files (``/slots``' save
and restore) are the same state under a name the client chose.  Decode thread only.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp

from bubo.domain.generation import CacheTags

from ._cells import CellLedger
from ._disk_cache import DiskTier
from ._kv_cells import KvCells
from ._kv_plan import MIN_SNAPSHOT_TOKENS
from ._snapshots import Snapshot, SnapshotStore
from .errors import EngineFailure

__all__ = ["TieredSequence"]

logger = logging.getLogger(__name__)


class TieredSequence(KvCells):
    """One sequence's cells and their copies in host RAM, on disk and in slot files."""

    def __init__(
        self,
        ctx: object,
        memory: object,
        seq_id: int,
        *,
        ledger: CellLedger | None,
        store: SnapshotStore | None,
        disk: DiskTier | None,
    ) -> None:
        """*store*: host RAM's snapshots, *disk*: the disk tier (each shared by the context's sequences)."""
        super().__init__(ctx, memory, seq_id, ledger=ledger)
        self.store = store
        self.disk = disk
        self.tags: CacheTags | None = None  # the conversation and template of the held tokens

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
                Snapshot(
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

    def _load(self, snapshot: Snapshot) -> int:
        """Load *snapshot* into the sequence; return its size (0 if llama.cpp refused it)."""
        restored = self._set_state(snapshot.data, snapshot.tokens, snapshot.adapters, snapshot.moved)
        if restored:
            self.tags = snapshot.tags
        return restored

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
        if self._state_size() > self.store.budget_bytes:
            return
        self.evict()

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
