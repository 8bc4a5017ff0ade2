"""Host RAM's snapshots of sequences that left their slot, under a byte budget (least recently used out).

A :class:`Snapshot` is a sequence's state copied out of llama.cpp
(``llama_state_seq_get_data``) with the tokens it holds; :class:`SnapshotStore`
keeps them for every slot of a context, and remembers the prefixes it evicted
(a later miss reports ``evicted``).  See :mod:`._kv` for when a sequence is
snapshotted and when a snapshot is restored.  No native calls: the decode thread
writes the store, and the reads marked so are safe from another thread.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import time
from collections.abc import Sequence

import attrs

from bubo.domain.generation import CacheTags

from ._kv_plan import MIN_SNAPSHOT_TOKENS, Held
from .lora import NO_ADAPTERS, AdapterSet
from .slots import common_prefix
from .values import SnapshotInfo

__all__ = ["Snapshot", "SnapshotStore"]

# Evicted prefixes remembered (to report "evicted" as the reason of a miss).
EVICTED_MEMORY = 64
EVICTED_PREFIX = 256


@attrs.define
class Snapshot:
    """A sequence's state copied to host memory, the tokens it holds and what it was computed under."""

    tokens: tuple[int, ...]
    data: ctypes.Array[ctypes.c_uint8]
    tags: CacheTags | None
    adapters: AdapterSet = NO_ADAPTERS
    moved: int | None = None  # the first cell --cache-reuse moved (None: every cell in place)
    last_used: float = attrs.field(factory=time.time)

    @property
    def size(self) -> int:
        """Bytes of the state."""
        return len(self.data)


class SnapshotStore:
    """Sequence-state snapshots in host RAM under a byte budget (LRU)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.OrderedDict[int, Snapshot] = collections.OrderedDict()
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

    def take(self, key: int) -> Snapshot:
        """The snapshot, marked most recently used."""
        self._entries.move_to_end(key)
        snapshot = self._entries[key]
        snapshot.last_used = time.time()
        return snapshot

    def add(self, snapshot: Snapshot) -> None:
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
