"""What the disk tier holds: this server's snapshot files by name, least recently used first.

The decode thread asks whether a sequence is held, worker threads find and
read the best file for a prompt, and the writer thread adds what it wrote and
deletes what it superseded; one lock guards the index for all of them.  No
file is touched here: :class:`~._disk_cache.DiskTier` reads, writes and deletes.
"""

from __future__ import annotations

import array
import collections
import threading
from collections.abc import Collection, Iterable, Sequence

from ._disk_format import DiskEntry
from .lora import NO_ADAPTERS, AdapterSet
from .slots import common_prefix

__all__ = ["DiskIndex"]


class DiskIndex:
    """Snapshot files by name, least recently used first, with their total size (safe from any thread)."""

    def __init__(self) -> None:
        """Empty."""
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[str, DiskEntry] = collections.OrderedDict()  # oldest first
        self._bytes = 0

    @property
    def total_bytes(self) -> int:
        """Bytes of the files held."""
        return self._bytes

    def entries(self) -> list[DiskEntry]:
        """The files held, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        """Whether the file *name* is held."""
        with self._lock:
            return name in self._entries

    def best(
        self, prompt: Sequence[int], adapters: AdapterSet = NO_ADAPTERS, *, max_tokens: int
    ) -> tuple[DiskEntry | None, int]:
        """The file under *adapters* sharing the longest prefix with *prompt* (at most ``len(prompt) - 1``).

        Returns it and that length.  Only files of fewer than *max_tokens* tokens count (a
        sequence could not hold the others), and only those computed under the same LoRA set.
        """
        limit = len(prompt) - 1
        best, best_len = None, 0
        for entry in self.entries():
            if len(entry.tokens) >= max_tokens or entry.adapters != adapters:
                continue
            match = common_prefix(entry.tokens, prompt, limit)
            if match > best_len:
                best, best_len = entry, match
        return best, best_len

    def found(self, entries: Iterable[DiskEntry]) -> None:
        """Index the files of earlier runs, in the order of their last use."""
        with self._lock:
            for entry in sorted(entries, key=lambda e: e.last_used):
                self._entries[entry.name] = entry
                self._bytes += entry.size_bytes

    def add(self, entry: DiskEntry) -> list[str]:
        """Index a file just written (the most recently used); the names of those it supersedes.

        A file whose tokens *entry*'s extend, under the same adapter set, is superseded.
        """
        with self._lock:
            old = self._entries.pop(entry.name, None)
            self._bytes -= old.size_bytes if old else 0
            self._entries[entry.name] = entry
            self._bytes += entry.size_bytes
            return [
                e.name
                for e in self._entries.values()
                if e.name != entry.name and e.adapters == entry.adapters and _extends(entry.tokens, e.tokens)
            ]

    def used(self, entry: DiskEntry, now: float) -> None:
        """*entry* was read at *now* (Unix time): the most recently used, if it is still held."""
        with self._lock:
            if entry.name in self._entries:
                self._entries.move_to_end(entry.name)
                entry.last_used = now

    def pop(self, name: str) -> None:
        """Forget the file *name*, if held."""
        with self._lock:
            entry = self._entries.pop(name, None)
            if entry is not None:
                self._bytes -= entry.size_bytes

    def keep_only(self, names: Collection[str]) -> None:
        """Forget every file not in *names* (another server sharing the tree deleted them)."""
        with self._lock:
            for name in [name for name in self._entries if name not in names]:
                self._bytes -= self._entries.pop(name).size_bytes


def _extends(longer: array.array[int], shorter: array.array[int]) -> bool:
    return len(shorter) < len(longer) and longer[: len(shorter)] == shorter
