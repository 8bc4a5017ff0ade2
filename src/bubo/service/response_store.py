"""Finished Responses-API responses kept in memory for ``previous_response_id``.

Bounded by count and by bytes, least recently used first out.  Each entry holds
the response as its JSON text (for ``GET /v1/responses/{id}``) and the
conversation that led to it (for a continuation).  Owned by the app; touched
only from the trio thread, so it needs no lock.

The byte budget counts what the entries really hold in memory: the body's bytes
and every message's objects and strings as Python sizes them (a non-ASCII
string takes two or four bytes per character, and every object has its
header), reasoning and tool calls included.  A continuation's conversation
shares its earlier turns' messages with the response it continues, so each
message object is counted once however many entries hold it, and is
uncounted when the last of them goes.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import attrs

from bubo.domain.messages import Message, ToolCall

__all__ = ["ResponseStore", "StoreStatistics", "StoredResponse", "message_bytes"]

# The store's own bookkeeping per entry (its OrderedDict node and id string) and per
# distinct message (its dict slot and reference count), measured with tracemalloc.
_ENTRY_OVERHEAD_BYTES = 192
_MESSAGE_OVERHEAD_BYTES = 96


def _text_bytes(text: str | None) -> int:
    return 0 if text is None else sys.getsizeof(text)


def _call_bytes(call: ToolCall) -> int:
    return sys.getsizeof(call) + sum(_text_bytes(t) for t in (call.id, call.name, call.arguments))


def message_bytes(message: Message) -> int:
    """The memory one message holds: the object, its strings, its tool calls."""
    texts = (message.content, message.reasoning, message.tool_call_id, message.name)
    return (
        sys.getsizeof(message)
        + sum(_text_bytes(t) for t in texts)
        + sys.getsizeof(message.tool_calls)
        + sum(_call_bytes(c) for c in message.tool_calls)
    )


@attrs.frozen(kw_only=True)
class StoredResponse:
    """One finished response and the conversation up to and including its output."""

    body: bytes
    conversation: tuple[Message, ...]

    @property
    def own_bytes(self) -> int:
        """The memory of the entry itself: its body and the conversation tuple (not the messages)."""
        return (
            _ENTRY_OVERHEAD_BYTES
            + sys.getsizeof(self)
            + sys.getsizeof(self.body)
            + sys.getsizeof(self.conversation)
        )

    @property
    def size(self) -> int:
        """The bytes this entry holds, counting every message it refers to (shared or not)."""
        return self.own_bytes + sum(_MESSAGE_OVERHEAD_BYTES + message_bytes(m) for m in self.conversation)


@attrs.frozen(kw_only=True)
class StoreStatistics:
    """What the store holds now (``/metrics``)."""

    entries: int
    bytes: int
    budget_bytes: int
    evictions: int


@attrs.define
class _Held:
    """A message some entries refer to: how many references, and its bytes."""

    message: Message  # keeps the object (and so its id) alive while counted
    references: int
    size: int


@attrs.define
class ResponseStore:
    """An LRU of stored responses under a count and a byte budget."""

    max_entries: int = 1000
    max_bytes: int = 64 * 1024 * 1024
    _entries: OrderedDict[str, StoredResponse] = attrs.field(factory=OrderedDict, init=False)
    _messages: dict[int, _Held] = attrs.field(factory=dict, init=False)  # by id(): each object once
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
        self._hold(entry)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._release(evicted)
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
        self._release(entry)
        return True

    def _hold(self, entry: StoredResponse) -> None:
        self._bytes += entry.own_bytes
        for message in entry.conversation:
            held = self._messages.get(id(message))
            if held is None:
                size = _MESSAGE_OVERHEAD_BYTES + message_bytes(message)
                held = self._messages[id(message)] = _Held(message, 0, size)
                self._bytes += held.size
            held.references += 1

    def _release(self, entry: StoredResponse) -> None:
        self._bytes -= entry.own_bytes
        for message in entry.conversation:
            held = self._messages[id(message)]
            held.references -= 1
            if held.references == 0:
                del self._messages[id(message)]
                self._bytes -= held.size

    def __len__(self) -> int:
        return len(self._entries)

    def statistics(self) -> StoreStatistics:
        """Entries and bytes held now, the byte budget, and evictions so far."""
        return StoreStatistics(
            entries=len(self._entries),
            bytes=self._bytes,
            budget_bytes=self.max_bytes,
            evictions=self.evictions,
        )

    @property
    def total_bytes(self) -> int:
        """Bytes held now."""
        return self._bytes
