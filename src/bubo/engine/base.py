"""The engine both engines share: session slots behind a FIFO gate, their life, sleep and slot files.

:class:`SlotEngine` implements every port of :class:`~._ports.Engine` from
parts with one role each: the slots and their queue (:class:`~.slots.SlotPool`),
the gate a generation passes (:class:`~._gate.GenerationGate`), whether the
engine serves (:class:`~._life.EngineLife`), whether the model is loaded
(:class:`~._sleep.Wakefulness`) and the LoRA scales
(:class:`~.lora.LoraScales`).  A subclass produces a generation's events, runs
the slot files' work and frees its model.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import trio

from bubo.domain.generation import EngineEvent, GenerationRequest, GrammarSpec
from bubo.domain.sampling import SamplingParams

from ._gate import GenerationGate
from ._life import EngineLife
from ._ports import EmbeddingModel, ImageReader
from ._sleep import Wakefulness
from .errors import SlotBusy
from .lora import LoraAdapter, LoraScales
from .slots import Slot, SlotPool
from .stats import EngineCounters, EngineStatistics
from .values import CacheContents, ModelInfo, SlotFile

__all__ = ["SlotEngine", "WakefulEngine"]

# Events a producer may run ahead of its consumer: the fake engine's bound, which lets
# tests see a slow client hold its producer; the llama.cpp engine lifts it (engine/llama.py).
_CHANNEL_BUFFER = 32


class WakefulEngine:
    """The :class:`~._ports.Sleeper` port over a :class:`Wakefulness`: an engine's model, freed while idle.

    An engine that can free its model and load it again says so (:attr:`can_sleep`)
    and implements :meth:`_fall_asleep` and :meth:`_wake_up`.
    """

    can_sleep = False

    def __init__(self, life: EngineLife) -> None:
        """*life*: the engine's, which a failed change of state loses and a retired engine keeps awake."""
        self.life = life
        self.wakefulness = Wakefulness(
            fall_asleep=self._fall_asleep, wake_up=self._wake_up, on_failure=life.lose
        )

    @property
    def sleeping(self) -> bool:
        """Whether the model is freed now (or being freed, or being loaded again)."""
        return self.wakefulness.sleeping

    @property
    def idle_since(self) -> float | None:
        """The trio time nothing has held the engine since; None while held (or never since the start)."""
        return self.wakefulness.idle_since

    @property
    def in_use(self) -> bool:
        """Whether something holds the engine awake now."""
        return self.wakefulness.holds > 0

    @property
    def sleeps(self) -> int:
        """How many times the model was freed."""
        return self.wakefulness.sleeps

    def awake(self) -> AbstractAsyncContextManager[None]:
        """See :meth:`~._ports.Sleeper.awake`."""
        return self.wakefulness.held()

    async def wait_activity(self) -> None:
        """See :meth:`~._ports.Sleeper.wait_activity`."""
        await self.wakefulness.wait_activity()

    async def sleep(self) -> bool:
        """Free the model if nothing holds it (and the engine can, and serves); whether it did."""
        if not self.can_sleep or self.life.retired:
            return False
        return await self.wakefulness.sleep()

    def _fall_asleep(self) -> None:
        """Free the model (blocking, in a worker thread; nothing holds the engine)."""
        raise NotImplementedError

    def _wake_up(self) -> None:
        """Load the model again (blocking, in a worker thread)."""
        raise NotImplementedError


class SlotEngine(WakefulEngine, abc.ABC):
    """Session slots behind a FIFO queue (:class:`SlotPool`); subclasses produce the events.

    Subclasses implement :meth:`_produce`, which runs while a slot is held and
    must send events into ``send`` (it need not close it), reporting what it
    does to the slot (:class:`Slot`).
    """

    # Events the producer may run ahead of the consumer (an engine may lift the bound).
    channel_buffer: float = _CHANNEL_BUFFER
    embedder: EmbeddingModel | None = None  # where the engine serves embeddings (Engine.embedder)
    vision: ImageReader | None = None  # what reads images, where the model takes them (Engine.vision)

    def __init__(
        self,
        info: ModelInfo,
        *,
        n_slots: int = 1,
        similarity: float = 0.1,
        totals: EngineCounters | None = None,
        lora: Sequence[LoraAdapter] = (),
        life: EngineLife | None = None,
    ) -> None:
        """*life*: the engine's, where a subclass needed it before (its own parts lose the engine)."""
        self.info = info
        self.lora = LoraScales(lora)
        self._totals = totals or EngineCounters()
        self._pool = SlotPool(
            [Slot(id=i, n_ctx=info.n_ctx, totals=self._totals) for i in range(n_slots)], similarity=similarity
        )
        super().__init__(life or EngineLife())
        self._gate = GenerationGate(self._pool, self.life, self._produce, channel_buffer=self.channel_buffer)

    @property
    def slots(self) -> tuple[Slot, ...]:
        """The session slots."""
        return self._pool.slots

    @property
    def n_slots(self) -> int:
        """How many session slots there are."""
        return len(self._pool.slots)

    @property
    def requests_running(self) -> int:
        """Slots held now (by a generation, or a slot action)."""
        return self._pool.held

    @property
    def requests_waiting(self) -> int:
        """Requests waiting for a slot."""
        return self._pool.waiting

    async def wait_idle(self) -> None:
        """Return once no request runs or waits for a slot."""
        await self._pool.wait_idle()

    async def wait_until(self, condition: Callable[[EngineStatistics], bool]) -> None:
        """Return once *condition* holds for :meth:`statistics`.

        It is checked whenever a request joins or leaves the queue or a slot
        changes hands (and, in the fake engine, after each generated piece).
        """
        await self._pool.wait_until(lambda: condition(self.statistics()))

    # ---- the ports' members that one part answers -----------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether a fatal failure left the engine unusable."""
        return self.life.lost

    @property
    def lora_adapters(self) -> tuple[LoraAdapter, ...]:
        """The loaded LoRA adapters, by id, with their global scales (``GET /lora-adapters``)."""
        return self.lora.adapters

    def set_lora_scales(self, scales: Sequence[float]) -> None:
        """See :meth:`~._ports.LoraControl.set_lora_scales`."""
        self.lora.set(scales)

    async def wait_lost(self) -> None:
        """Return once the engine is lost."""
        await self.life.wait_lost()

    async def wait_retired(self) -> None:
        """Return once the engine is closed or lost."""
        await self.life.wait_retired()

    def interrupt(self, error: Exception) -> None:
        """See :meth:`~._life.EngineLife.interrupt` (call on the trio thread)."""
        self.life.interrupt(error)

    # ---- generations ----------------------------------------------------------------------------

    @asynccontextmanager
    async def open_generation(
        self, request: GenerationRequest
    ) -> AsyncIterator[trio.MemoryReceiveChannel[EngineEvent]]:
        """Hold the model awake, then pass the gate (:meth:`~._gate.GenerationGate.open`)."""
        self.life.check_usable()
        request = self.lora.settle(request)
        async with self.awake(), self._gate.open(request) as events:
            yield events

    @abc.abstractmethod
    async def _produce(
        self, slot: Slot, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        """Run one generation while *slot* is held."""

    # ---- slot files: each action holds the idle slot, so no generation starts in it meanwhile ----

    async def save_slot(self, slot_id: int, path: Path) -> SlotFile:
        """See :meth:`~._ports.SlotFiles.save_slot`."""
        async with self.awake():
            with self._holding(slot_id) as slot:
                return await self._save_slot(slot, path)

    async def restore_slot(self, slot_id: int, path: Path) -> SlotFile:
        """See :meth:`~._ports.SlotFiles.restore_slot`."""
        async with self.awake():
            with self._holding(slot_id) as slot:
                return await self._restore_slot(slot, path)

    async def erase_slot(self, slot_id: int) -> int:
        """See :meth:`~._ports.SlotFiles.erase_slot`."""
        async with self.awake():
            with self._holding(slot_id) as slot:
                return await self._erase_slot(slot)

    @contextlib.contextmanager
    def _holding(self, slot_id: int) -> Iterator[Slot]:
        self.life.check_usable()
        slot = self._pool.try_hold(slot_id)
        if slot is None:
            raise SlotBusy(f"slot {slot_id} is busy with a request; retry once it is idle")
        try:
            yield slot
        finally:
            self._pool.release(slot)

    @abc.abstractmethod
    async def _save_slot(self, slot: Slot, path: Path) -> SlotFile:
        """Write the held, idle *slot*'s state to *path*."""

    @abc.abstractmethod
    async def _restore_slot(self, slot: Slot, path: Path) -> SlotFile:
        """Load *path* into the held, idle *slot*."""

    @abc.abstractmethod
    async def _erase_slot(self, slot: Slot) -> int:
        """Empty the held, idle *slot*; return the tokens it held."""

    # ---- what the engine reports ------------------------------------------------------------------

    def statistics(self) -> EngineStatistics:
        """A snapshot of the totals and of every slot."""
        return self._pool.statistics(
            self._totals,
            kv_cache_tokens=self._kv_used_by(self._pool.slots),
            kv_cache_capacity=self._kv_capacity(),
            kv_cache_tokens_running=self._kv_used_by(self._pool.held_slots),
        )

    def _kv_capacity(self) -> int:
        """Tokens the KV cache holds, all slots together (a unified cache: one context's worth)."""
        return self.info.n_ctx

    def _kv_used_by(self, slots: Sequence[Slot]) -> int:
        """Cells the sequences of *slots* hold (an engine whose slots share cells counts each once)."""
        return sum(slot.n_cached for slot in slots)

    def cache_contents(self) -> CacheContents:
        """What the prompt cache holds (engines with snapshots say more)."""
        return CacheContents(live_tokens=self._kv_used_by(self._pool.slots), budget_bytes=0)

    # ---- the end --------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Wait until no request runs or waits, then close; later requests are refused."""
        await self._pool.wait_idle()
        await self.wakefulness.settled()
        self.life.close()
        await trio.to_thread.run_sync(self.close)

    @abc.abstractmethod
    def compile_grammar(self, spec: GrammarSpec) -> str:
        """GBNF text for *spec* (see :meth:`~._ports.Generator.compile_grammar`)."""

    def prepare_sampling(self, sampling: SamplingParams) -> None:
        """Nothing to prepare unless a subclass says so (see :meth:`~._ports.Generator.prepare_sampling`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the engine holds; the engine is unusable afterwards."""
