"""What the prompt cache holds, for ``/slots`` and the cache's statistics: live cells, host RAM, disk."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import CacheContents, SnapshotInfo

if TYPE_CHECKING:
    from ._context import LlamaContext
    from ._disk_cache import DiskTier

__all__ = ["cache_contents"]


def cache_contents(
    context: LlamaContext | None, disk: DiskTier | None, *, ram_budget_bytes: int
) -> CacheContents:
    """The live sequences and host-RAM snapshots of *context* (None: the model sleeps), and *disk*'s files.

    A sleeping model's live cells and snapshots were freed with its context;
    the disk tier's files stay, and so does the host-RAM budget the next load
    gets.  Read on the trio thread.
    """
    on_disk = tuple(
        SnapshotInfo(
            n_tokens=len(entry.tokens),
            size_bytes=entry.size_bytes,
            conversation=None,
            last_used=entry.last_used,
            tier="disk",
        )
        for entry in (disk.entries() if disk is not None else ())
    )
    disk_budget = disk.budget_bytes if disk is not None else 0
    if context is None:
        return CacheContents(
            live_tokens=0,
            budget_bytes=ram_budget_bytes,
            disk_budget_bytes=disk_budget,
            disk_snapshots=on_disk,
        )
    store = context.caches[0].store
    return CacheContents(
        live_tokens=context.cells_used,
        budget_bytes=store.budget_bytes if store is not None else 0,
        snapshots=tuple(store.snapshots()) if store is not None else (),
        disk_budget_bytes=disk_budget,
        disk_snapshots=on_disk,
    )
