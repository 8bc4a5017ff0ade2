"""A memory guard whose probe reports fixed numbers, and the runtime that admits work against it."""

from __future__ import annotations

import attrs

from bubo.service.memory import MemoryGuard, MemoryReading
from bubo.service.runtime import Runtime
from bubo.service.work import Workers

MIB = 1024 * 1024


@attrs.frozen
class FixedMemory:
    """A probe that always reads *available* bytes free under a *limit*."""

    available: int
    limit: int = 1024 * MIB

    def read(self) -> MemoryReading:
        return MemoryReading(available_bytes=self.available, limit_bytes=self.limit)


def guard_with(available: int) -> MemoryGuard:
    """A guard on a machine with *available* bytes free, counting one byte per KV token and nothing else."""
    return MemoryGuard(probe=FixedMemory(available), kv_bytes_per_token=1, step_bytes=0, low_water_bytes=0)


def with_memory(runtime: Runtime, available: int) -> Runtime:
    """*runtime* admitting its requests and workers against :func:`guard_with` (*available*)."""
    guard = guard_with(available)
    return attrs.evolve(runtime, memory_guard=guard, workers=Workers(guard=guard))
