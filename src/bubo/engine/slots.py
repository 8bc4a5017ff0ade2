"""Session slots: the accounting of each one, and the FIFO queue that hands them out.

A request holds one slot from admission to the end of its generation.  The
:class:`SlotPool` gives slots out in arrival order; a free slot goes to the
first waiting request it can serve (a request pinned to a busy slot with
``id_slot`` lets the ones behind it pass).  Which free slot a request gets
follows llama-server: the one whose cached tokens share the longest prefix with
the prompt, when that prefix is more than ``similarity`` of the prompt
(``--slot-prompt-similarity``), else the least recently used one.  Only a
slot whose tokens were computed under the request's LoRA adapter set counts
as sharing a prefix (a sequence computed under other adapters is not one).

A :class:`Slot` owns its task's counters and adds to the engine's totals: an
engine reports facts to it (a prompt chunk evaluated, a token generated) and
never writes counters itself.  Facts are written by the slot's producer (the
decode thread for llama.cpp) and read on the trio thread; each is a single
int/float store, so a reader never sees a torn value.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import trio

from .lora import NO_ADAPTERS, AdapterSet
from .stats import EngineCounters, EngineStatistics, SlotStatistics

__all__ = ["EMPTY_MIRROR", "Slot", "SlotPool", "TokenMirror", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the common prefix of *a* and *b*, at most *limit*."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TokenMirror(Protocol):
    """What a slot's KV sequence holds, read from the trio thread while a producer may change it."""

    @property
    def n_tokens(self) -> int:
        """How many tokens it holds (cheap: no copy)."""
        ...

    def head(self, n: int) -> Sequence[int]:
        """A copy of its first *n* tokens (for matching a prompt's prefix)."""
        ...

    @property
    def adapters(self) -> AdapterSet:
        """The LoRA adapter set its tokens were computed under."""
        ...


@attrs.frozen
class _Empty:
    n_tokens: int = 0
    adapters: AdapterSet = NO_ADAPTERS

    def head(self, _n: int) -> Sequence[int]:
        return ()


EMPTY_MIRROR: TokenMirror = _Empty()
"""A slot whose KV sequence holds nothing (no context yet, or the model sleeps)."""


@attrs.define(eq=False)
class Slot:
    """One session slot and the accounting of the task that holds (or last held) it."""

    id: int
    n_ctx: int
    totals: EngineCounters
    mirror: TokenMirror = EMPTY_MIRROR
    """The tokens the slot's KV sequence holds (the engine sets it; read for slot choice and counts)."""
    is_processing: bool = False
    id_task: int = -1
    prompt_length: int = 0  # positions of the task's prompt (an image's stand-ins included)
    prompt_processed: int = 0
    prompt_cached: int = 0
    prompt_shared: int = 0  # of prompt_cached, the tokens whose cells came from another slot's sequence
    decoded: int = 0
    limit: int = -1  # tokens the task may generate; -1: unlimited
    last_used: int = -1  # the task id that last held the slot (least recently used first)
    lora: tuple[float, ...] = ()  # the task's scale of each LoRA adapter

    def begin(
        self,
        task_id: int,
        max_new_tokens: int | None,
        lora: tuple[float, ...] = (),
        *,
        prompt_length: int = 0,
    ) -> None:
        """A task with a prompt of *prompt_length* positions takes the slot: its counters start from zero."""
        self.is_processing = True
        self.lora = lora
        self.prompt_length = prompt_length
        self.id_task = self.last_used = task_id
        self.prompt_processed = self.prompt_cached = self.prompt_shared = self.decoded = 0
        self.limit = -1 if max_new_tokens is None else max_new_tokens

    def end(self) -> None:
        """The task left the slot; its counters stay for ``/slots`` until the next one."""
        self.is_processing = False

    def reused(self, n_tokens: int, *, shared: int = 0) -> None:
        """*n_tokens* of the prompt came from the cache, *shared* of them from another slot's cells."""
        self.prompt_cached = n_tokens
        self.prompt_shared = shared
        self.totals.prompt_tokens_cached += n_tokens

    def evaluated(self, n_tokens: int) -> None:
        """*n_tokens* more of the prompt were evaluated."""
        self.prompt_processed += n_tokens
        self.totals.prompt_tokens += n_tokens

    def prompt_took(self, seconds: float) -> None:
        """The prompt's evaluation ended after *seconds*."""
        self.totals.prompt_seconds += seconds

    def generated(self) -> None:
        """One more token was generated."""
        self.decoded += 1
        self.totals.tokens_predicted += 1

    def generation_took(self, seconds: float) -> None:
        """The generation phase ended after *seconds*."""
        self.totals.tokens_predicted_seconds += seconds

    def draft_verified(self, n_drafted: int, n_accepted: int) -> None:
        """A draft of *n_drafted* tokens was verified in one step; *n_accepted* of them were kept."""
        self.totals.draft_tokens += n_drafted
        self.totals.draft_steps += 1
        self.totals.draft_accepted += n_accepted

    def holds(self, n_tokens: int) -> None:
        """The slot's KV sequence now holds *n_tokens* (the longest ever held is a total)."""
        self.totals.n_tokens_max = max(self.totals.n_tokens_max, n_tokens)

    @property
    def prompt_unread(self) -> int:
        """Prompt positions the running task has neither found cached nor evaluated yet (0 when idle)."""
        if not self.is_processing:
            return 0
        return max(0, self.prompt_length - self.prompt_cached - self.prompt_processed)

    @property
    def n_cached(self) -> int:
        """Tokens the slot's KV sequence holds now (read from the cache: evictions show at once)."""
        return self.mirror.n_tokens

    def statistics(self) -> SlotStatistics:
        """The slot as ``/slots`` and ``/metrics`` show it (the engine's cheap properties answer the rest)."""
        return SlotStatistics(
            id=self.id,
            n_ctx=self.n_ctx,
            is_processing=self.is_processing,
            id_task=self.id_task,
            n_prompt_tokens=self.n_cached,
            n_prompt_tokens_processed=self.prompt_processed,
            n_prompt_tokens_cache=self.prompt_cached,
            n_prompt_tokens_shared=self.prompt_shared,
            n_decoded=self.decoded,
            n_remain=-1 if self.limit < 0 else max(0, self.limit - self.decoded),
            lora=self.lora,
        )


@attrs.define(eq=False)
class _Waiter:
    prompt: Sequence[int]
    pinned: int | None
    adapters: AdapterSet
    ready: trio.Event = attrs.field(factory=trio.Event)
    slot: Slot | None = None


class SlotPool:
    """The slots of one engine and the FIFO queue of requests waiting for one (trio thread only)."""

    def __init__(self, slots: Sequence[Slot], *, similarity: float) -> None:
        self.slots = tuple(slots)
        self._similarity = similarity
        self._held: set[int] = set()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._idle = trio.Event()
        self._idle.set()
        self._changes = trio.lowlevel.ParkingLot()

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot (llama-server's ``requests_deferred``)."""
        return len(self._waiters)

    @property
    def held(self) -> int:
        """Slots held by a request."""
        return len(self._held)

    @property
    def held_slots(self) -> tuple[Slot, ...]:
        """The slots held now (by a generation, or a slot action)."""
        return tuple(slot for slot in self.slots if slot.id in self._held)

    @property
    def waiting_tokens(self) -> int:
        """Prompt positions of the requests waiting for a slot, all together."""
        return sum(len(waiter.prompt) for waiter in self._waiters)

    def statistics(
        self,
        totals: EngineCounters,
        *,
        kv_cache_tokens: int,
        kv_cache_capacity: int,
        kv_cache_tokens_running: int,
    ) -> EngineStatistics:
        """A snapshot of *totals*, the queue and every slot, with the KV cache's counts the engine gives."""
        return EngineStatistics(
            prompt_tokens_total=totals.prompt_tokens,
            prompt_tokens_cached_total=totals.prompt_tokens_cached,
            prompt_seconds_total=totals.prompt_seconds,
            tokens_predicted_total=totals.tokens_predicted,
            tokens_predicted_seconds_total=totals.tokens_predicted_seconds,
            n_decode_total=totals.n_decode,
            n_busy_slots_per_decode=totals.busy_slots / totals.n_decode if totals.n_decode else 0.0,
            n_tokens_max=totals.n_tokens_max,
            draft_tokens_total=totals.draft_tokens,
            draft_accepted_total=totals.draft_accepted,
            draft_steps_total=totals.draft_steps,
            requests_processing=self.held,
            requests_deferred=self.waiting,
            kv_cache_tokens=kv_cache_tokens,
            kv_cache_capacity=kv_cache_capacity,
            kv_cache_tokens_running=kv_cache_tokens_running,
            prompt_tokens_waiting=self.waiting_tokens + sum(slot.prompt_unread for slot in self.slots),
            slots=tuple(slot.statistics() for slot in self.slots),
        )

    async def acquire(
        self, prompt: Sequence[int], pinned: int | None = None, adapters: AdapterSet = NO_ADAPTERS
    ) -> Slot:
        """Wait for a slot for *prompt* under *adapters* (*pinned*: that slot only), in arrival order."""
        waiter = _Waiter(prompt, pinned, adapters)
        self._waiters.append(waiter)
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._dispatch()
        try:
            await waiter.ready.wait()
        except BaseException:
            if waiter.slot is not None:  # given a slot in the moment it was cancelled
                self.release(waiter.slot)
            else:
                self._waiters.remove(waiter)
                self._dispatch()  # a pinned waiter ahead may have held others back
            raise
        assert waiter.slot is not None
        return waiter.slot

    def try_hold(self, slot_id: int) -> Slot | None:
        """Hold the slot *slot_id* now if it is free (no generation gets it meanwhile), else None."""
        if slot_id in self._held:
            return None
        self._held.add(slot_id)
        if self._idle.is_set():
            self._idle = trio.Event()
        return self.slots[slot_id]

    def release(self, slot: Slot) -> None:
        """Give *slot* back: the first waiter it can serve gets it."""
        self._held.discard(slot.id)
        self._dispatch()

    async def wait_idle(self) -> None:
        """Return once no slot is held and no request waits."""
        await self._idle.wait()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Return once *condition* holds; it is checked again at each :meth:`changed`."""
        while not condition():
            await self._changes.park()

    def changed(self) -> None:
        """Wake :meth:`wait_until`: the queue, a slot's holder or a slot's counters changed."""
        self._changes.unpark_all()

    def _dispatch(self) -> None:
        for waiter in list(self._waiters):
            if len(self._held) == len(self.slots):
                break
            slot = self._choose(waiter)
            if slot is None:
                continue
            self._waiters.remove(waiter)
            self._held.add(slot.id)
            waiter.slot = slot
            waiter.ready.set()
        if not self._held and not self._waiters:
            self._idle.set()
        self.changed()

    def _choose(self, waiter: _Waiter) -> Slot | None:
        free = [slot for slot in self.slots if slot.id not in self._held]
        if waiter.pinned is not None:
            return next((slot for slot in free if slot.id == waiter.pinned), None)
        if not free:
            return None
        prompt = waiter.prompt
        # only a prefix computed under the request's adapter set is one it can reuse
        same = [slot for slot in free if slot.mirror.adapters == waiter.adapters]
        if self._similarity > 0 and prompt and len(free) > 1 and same:
            matches = [(common_prefix(slot.mirror.head(len(prompt)), prompt), slot) for slot in same]
            length, best = max(matches, key=lambda match: match[0])
            if length / len(prompt) > self._similarity:
                return best
        return min(free, key=lambda slot: slot.last_used)
