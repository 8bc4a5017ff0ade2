"""Finished Responses-API responses kept in memory for ``previous_response_id``.

Bounded by count and by bytes, least recently used first out.  Each entry holds
the response as its JSON text (for ``GET /v1/responses/{id}``) and the
conversation that led to it (for a continuation).  Owned by the app; touched
only from the trio thread, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from bubo.domain.messages import Message

__all__ = ["ResponseStore", "StoredResponse"]


@attrs.frozen(kw_only=True)
class StoredResponse:
    """One finished response and the conversation up to and including its output."""

    body: bytes
    conversation: tuple[Message, ...]

    @property
    def size(self) -> int:
        """An estimate of the bytes this entry holds."""
        text = sum(len(m.content or "") + len(m.reasoning or "") for m in self.conversation)
        calls = sum(len(c.arguments) + len(c.name) for m in self.conversation for c in m.tool_calls)
        return len(self.body) + text + calls + 64 * len(self.conversation)


@attrs.define
class ResponseStore:
    """An LRU of stored responses under a count and a byte budget."""

    max_entries: int = 1000
    max_bytes: int = 64 * 1024 * 1024
    _entries: OrderedDict[str, StoredResponse] = attrs.field(factory=OrderedDict, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    evictions: int = attrs.field(default=0, init=False)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Keep *entry*; evict the least recently used until both budgets hold.

        An entry larger than the whole byte budget is not kept.
        """
        self.delete(response_id)
        if entry.size > self.max_bytes or self.max_entries < 1:
            self.evictions += 1
            return
        self._entries[response_id] = entry
        self._bytes += entry.size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size
            self.evictions += 1

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, now the most recently used; ``None`` if unknown or evicted."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget an entry; whether there was one."""
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        """Bytes held now."""
        return self._bytes
