"""The engine interface, its statistics, and the slots' FIFO generation gate.

Cancellation story (see ``docs/design.md``): a request opens a generation with
``async with engine.open_generation(request) as events``.  Waiting for a slot
is waiting in the :class:`SlotPool`'s FIFO queue; a client that leaves while
queued is simply cancelled out of that wait and never touches a running
generation.  Once a slot is held, the producer (a sequence on the llama.cpp
engine's decode thread, a task for the fake engine) runs in a nursery and sends
events through a memory channel.  Leaving the ``async with`` block, for any
reason, cancels the producer; the decode thread drops the sequence at its next
step, and the slot is given back only then.  :meth:`SlotEngine.interrupt`
(shutdown's deadline) cancels the waits and the producers the same way, then
hands each its error: waiting requests raise it, running ones get it as their
last event, so every dialect can report it.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt
import trio

from bubo.domain.generation import EngineEvent, GenerationFailed, GenerationRequest, GrammarSpec
from bubo.domain.media import PromptImage
from bubo.domain.modes import Pooling
from bubo.domain.sampling import SamplingParams
from bubo.errors import BuboError, DeviceLost, InternalError, InvalidRequest, ServiceUnavailable

from ._sleep import Wakefulness
from .lora import NO_ADAPTERS, AdapterSet, LoraAdapter, adapter_set
from .slots import Slot, SlotPool
from .stats import EngineCounters, EngineStatistics, SlotStatistics

__all__ = [
    "CacheContents",
    "EmbeddingModel",
    "Engine",
    "EngineCounters",
    "EngineFailure",
    "EngineStatistics",
    "FimTokens",
    "GrammarRejected",
    "ImageReader",
    "LoraAdapter",
    "ModelInfo",
    "PairFormat",
    "RepackDecision",
    "SlotBusy",
    "SlotEngine",
    "SlotFile",
    "SlotStatistics",
    "SnapshotInfo",
]

logger = logging.getLogger(__name__)

# Events a producer may run ahead of its consumer: the fake engine's bound, which lets
# tests see a slow client hold its producer; the llama.cpp engine lifts it (engine/llama.py).
_CHANNEL_BUFFER = 32


class GrammarRejected(InvalidRequest):
    """A grammar (or a JSON schema in it) that llama.cpp cannot convert or parse (400)."""

    default_code = "unsupported_schema"


class SlotBusy(ServiceUnavailable):
    """A slot action on a slot a request holds (503, as llama-server answers)."""

    default_code = "slot_busy"


class SlotFileNoRoom(ServiceUnavailable):
    """A slot file needs more of the context the slots share than the others leave now (503, Retry-After)."""

    default_code = "context_full"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})


@attrs.frozen(kw_only=True)
class SlotFile:
    """A slot saved to or restored from a file: its tokens, the file's size, the slot's LoRA adapter set."""

    n_tokens: int
    n_bytes: int
    adapters: AdapterSet = NO_ADAPTERS  # its cells' LoRA set: computed under (save), taken as (restore)


class EngineFailure(InternalError):
    """The engine could not run a generation (llama.cpp returned an error).

    ``fatal``: the context is unusable (a compute failure, a lost device); the
    engine serves nothing more and the server reports ``device_lost``.
    """

    default_code = "engine_error"

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@attrs.frozen(kw_only=True)
class RepackDecision:
    """Whether llama.cpp may repack the weights into its CPU extra buffer types (AMX, CPU_REPACK), and why."""

    enabled: bool
    reason: str  # one phrase for the log and /props, e.g. "the probe decode passed"


@attrs.frozen(kw_only=True)
class FimTokens:
    """The vocabulary's fill-in-the-middle tokens (llama.cpp's ``llama_vocab_fim_*``); ``None``: absent.

    ``pre``, ``suf`` and ``mid`` frame the gap; ``rep`` (repository name) and
    ``sep`` (file separator) frame the extra context files of repo-level FIM.
    """

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None


@attrs.frozen(kw_only=True)
class ModelInfo:
    """What is known about the loaded model (feeds ``/props``, ``/v1/models``)."""

    path: str
    architecture: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size_bytes: int
    vocab_type: int  # llama.cpp's enum: 1 SPM, 2 BPE, 3 WPM, 4 UGM
    description: str  # e.g. "llama ?B Q4_1"
    eog_token_ids: frozenset[int]
    repack: RepackDecision
    n_batch: int = 2048  # tokens one llama_decode takes (the context's --batch-size)
    fim: FimTokens | None = None  # None: the vocabulary has no fill-in-the-middle tokens
    draft_model: str | None = None  # the draft model's path (--model-draft); None: none is loaded
    context_shift: bool = False  # generations go on past the context's end (--context-shift)
    # what a KV state of this model and these settings is (the disk tier's kv_identity): the model file's
    # content, llama.cpp's state format, the KV settings, the adapter files; slot files record it
    state_identity: str = ""
    # a decoder with causal attention; False: an encoder (BERT's kind, no KV cache, no next token to
    # sample), which serves embeddings or ranking only
    generates: bool = True


@attrs.frozen(kw_only=True)
class SnapshotInfo:
    """One prompt-cache snapshot, in host RAM or in a file."""

    n_tokens: int
    size_bytes: int
    conversation: str | None  # the conversation tag of the request that left it (RAM only)
    last_used: float = 0.0  # Unix time it was stored or last restored
    tier: str = "ram"  # ram | disk


@attrs.frozen(kw_only=True)
class CacheContents:
    """What the prompt cache holds (``/cache``, ``/debug/cache``), least recently used first in each tier."""

    live_tokens: int  # tokens in the slots' KV cache
    budget_bytes: int  # host RAM allowed for snapshots (0: none)
    snapshots: tuple[SnapshotInfo, ...] = ()  # in host RAM
    disk_budget_bytes: int = 0  # disk allowed for snapshot files (0: no disk tier)
    disk_snapshots: tuple[SnapshotInfo, ...] = ()


@attrs.frozen(kw_only=True)
class PairFormat:
    """How a reranker reads one (query, document) pair: llama.cpp's ``format_prompt_rerank``.

    With the GGUF's ``rerank`` template (``tokenizer.chat_template.rerank``), its
    ``{query}`` and ``{document}`` are replaced by the texts and the whole is
    tokenized with special tokens parsed and none added.  Without one, the
    texts are tokenized apart (specials neither added nor parsed) and joined as
    ``[BOS] query [EOS] [SEP] document [EOS]``, each marker only where the
    vocabulary adds it (None here: not added); EOS is the SEP token in a
    vocabulary without EOS (BERT's: ``[CLS] query [SEP] document``).
    """

    template: str | None = None
    bos: int | None = None
    eos: int | None = None
    sep: int | None = None


class EmbeddingModel(Protocol):
    """Token ids to embeddings, blocking (call from a worker thread); see ``engine/_embedder.py``."""

    @property
    def pooling(self) -> Pooling:
        """llama.cpp's pooling: ``none`` (a vector per token), ``mean``, ``cls``, ``last`` or ``rank``."""
        ...

    @property
    def n_tokens(self) -> int:
        """The most tokens one input may have."""
        ...

    @property
    def n_embd(self) -> int:
        """The length of each vector (a reranker's: its classifier's outputs, ``n_cls_out``)."""
        ...

    @property
    def pair_format(self) -> PairFormat:
        """How a (query, document) pair becomes one input (for ``rank`` pooling)."""
        ...

    def embed(self, tokens: Sequence[int], *, last_only: bool = False) -> npt.NDArray[np.float32]:
        """Shape ``(n_embd,)`` when pooled, ``(len(tokens), n_embd)`` with ``none``.

        *last_only*, with ``none``: only the last token's row, shape ``(n_embd,)`` (the others
        are not computed).
        """
        ...


class ImageReader(Protocol):
    """Image files to prompt input, blocking (call from a worker thread); see ``engine/_vision.py``."""

    @property
    def max_pixels(self) -> int:
        """The most pixels (width times height) an image may have."""
        ...

    @property
    def max_images(self) -> int:
        """The most images one request may hold."""
        ...

    @property
    def encoder_bytes(self) -> int:
        """The working memory encoding one image takes (the memory guard's estimate)."""
        ...

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """Decode *data* (PNG, JPEG, WebP, GIF, BMP) and tokenize it for the prompt.

        Raises:
            InvalidRequest: not a readable image, or over :attr:`max_pixels` (``param`` names it).

        """
        ...


class Engine(Protocol):
    """What the service layer needs from a decode engine."""

    @property
    def embedder(self) -> EmbeddingModel | None:
        """The embedding model (``--embeddings``), or None when embeddings are not served."""
        ...

    @property
    def vision(self) -> ImageReader | None:
        """What reads images into prompts (``--mmproj``), or None for a model that reads text only."""
        ...

    @property
    def info(self) -> ModelInfo:
        """The loaded model."""
        ...

    def open_generation(
        self, request: GenerationRequest
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[EngineEvent]]:
        """Wait for the slot, then stream the generation's events.

        Used as ``async with engine.open_generation(req) as events``; the last
        event is always :class:`GenerationFinished` unless the block is left early.
        """
        ...

    @property
    def n_slots(self) -> int:
        """How many session slots there are (cheap, as the next two: for admission and checks)."""
        ...

    @property
    def requests_running(self) -> int:
        """Slots held now (by a generation, or a slot action)."""
        ...

    @property
    def requests_waiting(self) -> int:
        """Requests waiting for a slot."""
        ...

    def statistics(self) -> EngineStatistics:
        """A consistent-enough snapshot of counters and every slot's state (``/slots``, ``/metrics``)."""
        ...

    @property
    def lora_adapters(self) -> tuple[LoraAdapter, ...]:
        """The loaded LoRA adapters, by id, with their global scales (``GET /lora-adapters``)."""
        ...

    def set_lora_scales(self, scales: Sequence[float]) -> None:
        """Set every adapter's global scale (one per adapter, by id), for the requests that start later."""
        ...

    async def wait_idle(self) -> None:
        """Return once no request runs or waits for a slot."""
        ...

    async def wait_retired(self) -> None:
        """Return once the engine is closed or lost."""
        ...

    @property
    def lost(self) -> bool:
        """Whether a fatal failure left the engine unusable."""
        ...

    async def wait_lost(self) -> None:
        """Return once the engine is lost."""
        ...

    def interrupt(self, error: BuboError) -> None:
        """End the running generation and every waiting one with *error*; refuse later ones with it."""
        ...

    async def aclose(self) -> None:
        """Wait until no request runs or waits, then free the model; the engine is unusable afterwards."""
        ...

    async def save_slot(self, slot_id: int, path: Path) -> SlotFile:
        """Write idle slot *slot_id*'s KV state and tokens to *path*.

        Raises:
            SlotBusy: a request holds the slot.
            EngineFailure: the file could not be written.

        """
        ...

    async def restore_slot(self, slot_id: int, path: Path) -> SlotFile:
        """Replace idle slot *slot_id*'s KV state with the one saved in *path*.

        Raises:
            SlotBusy: a request holds the slot.
            EngineFailure: the file could not be read (the slot is then empty).

        """
        ...

    async def erase_slot(self, slot_id: int) -> int:
        """Empty idle slot *slot_id*'s KV sequence; return how many tokens it held.

        Raises:
            SlotBusy: a request holds the slot.

        """
        ...

    def compile_grammar(self, spec: GrammarSpec) -> str:
        """The GBNF text a request's grammar becomes (checked: it will load when the request runs).

        Raises:
            GrammarRejected: the spec cannot be converted or parsed.

        """
        ...

    def prepare_sampling(self, sampling: SamplingParams) -> None:
        """Do now, on the calling (worker) thread, the costly part of building *sampling*'s chain."""
        ...

    def cache_contents(self) -> CacheContents:
        """What the prompt cache holds."""
        ...

    @property
    def can_sleep(self) -> bool:
        """Whether the engine can free its model while idle and load it again (:meth:`sleep`)."""
        ...

    @property
    def sleeping(self) -> bool:
        """Whether the model is freed now (or being freed, or being loaded again)."""
        ...

    @property
    def idle_since(self) -> float | None:
        """The trio time nothing has held the engine since; None while held (or never since the start)."""
        ...

    @property
    def in_use(self) -> bool:
        """Whether something holds the engine awake now (:meth:`awake`)."""
        ...

    def awake(self) -> AbstractAsyncContextManager[None]:
        """Hold the model loaded for a block that touches it, loading it again first if it sleeps.

        Raises (on entry):
            ServiceUnavailable: it is still loading after the wait's bound (``model_waking``).

        """
        ...

    async def sleep(self) -> bool:
        """Free the model if nothing holds it; whether it did."""
        ...

    async def wait_activity(self) -> None:
        """Return when a hold of :meth:`awake` ends."""
        ...


class SlotEngine(abc.ABC):
    """Session slots behind a FIFO queue (:class:`SlotPool`); subclasses produce the events.

    Subclasses implement :meth:`_produce`, which runs while a slot is held and
    must send events into ``send`` (it need not close it), reporting what it
    does to the slot (:class:`Slot`).
    """

    # Events the producer may run ahead of the consumer (an engine may lift the bound).
    channel_buffer: float = _CHANNEL_BUFFER
    # The embedding model, where the engine serves embeddings (see Engine.embedder).
    embedder: EmbeddingModel | None = None
    # What reads images, where the model takes them (see Engine.vision).
    vision: ImageReader | None = None

    def __init__(
        self,
        info: ModelInfo,
        *,
        n_slots: int = 1,
        similarity: float = 0.1,
        totals: EngineCounters | None = None,
        lora: Sequence[LoraAdapter] = (),
    ) -> None:
        self._info = info
        self._lora_paths = tuple(adapter.path for adapter in lora)
        self._lora_scales = tuple(adapter.scale for adapter in lora)
        self._totals = totals or EngineCounters()
        self._pool = SlotPool(
            [Slot(id=i, n_ctx=info.n_ctx, totals=self._totals) for i in range(n_slots)], similarity=similarity
        )
        self._next_task_id = 0
        self._closed = False
        self._lost = trio.Event()
        self._retired = trio.Event()  # closed or lost
        self._interruption: BuboError | None = None  # set by interrupt(): every generation ends with it
        self._interruptible: set[trio.CancelScope] = set()  # slot waits and the running producers
        self._wakefulness = Wakefulness(
            fall_asleep=self._fall_asleep, wake_up=self._wake_up, on_failure=self._lose
        )

    @property
    def info(self) -> ModelInfo:
        """The loaded model."""
        return self._info

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

    @property
    def lost(self) -> bool:
        """Whether a fatal failure left the engine unusable."""
        return self._lost.is_set()

    @property
    def lora_adapters(self) -> tuple[LoraAdapter, ...]:
        """See :meth:`Engine.lora_adapters`."""
        return tuple(
            LoraAdapter(id=i, path=path, scale=scale)
            for i, (path, scale) in enumerate(zip(self._lora_paths, self._lora_scales, strict=True))
        )

    def set_lora_scales(self, scales: Sequence[float]) -> None:
        """See :meth:`Engine.set_lora_scales` (a running request keeps the scales it started with)."""
        if len(scales) != len(self._lora_paths):
            raise ValueError(f"{len(scales)} scales for {len(self._lora_paths)} adapters")
        self._lora_scales = tuple(float(scale) for scale in scales)

    async def wait_lost(self) -> None:
        """Return once the engine is lost."""
        await self._lost.wait()

    async def wait_retired(self) -> None:
        """Return once the engine is closed or lost."""
        await self._retired.wait()

    async def wait_idle(self) -> None:
        """Return once no request runs or waits for a slot."""
        await self._pool.wait_idle()

    async def wait_until(self, condition: Callable[[EngineStatistics], bool]) -> None:
        """Return once *condition* holds for :meth:`statistics`.

        It is checked whenever a request joins or leaves the queue or a slot
        changes hands (and, in the fake engine, after each generated piece).
        """
        await self._pool.wait_until(lambda: condition(self.statistics()))

    # ---- sleeping while idle (engine/_sleep.py) -------------------------------------------------

    can_sleep = False  # engines that can free their model and load it again say so

    @property
    def sleeping(self) -> bool:
        """Whether the model is freed now (or being freed, or being loaded again)."""
        return self._wakefulness.sleeping

    @property
    def idle_since(self) -> float | None:
        """The trio time nothing has held the engine since; None while held (or never since the start)."""
        return self._wakefulness.idle_since

    @property
    def in_use(self) -> bool:
        """Whether something holds the engine awake now."""
        return self._wakefulness.holds > 0

    @property
    def sleeps(self) -> int:
        """How many times the model was freed."""
        return self._wakefulness.sleeps

    def awake(self) -> AbstractAsyncContextManager[None]:
        """See :meth:`Engine.awake`."""
        return self._wakefulness.held()

    async def sleep(self) -> bool:
        """Free the model if nothing holds it (and the engine can); whether it did."""
        if not self.can_sleep or self._closed or self.lost:
            return False
        return await self._wakefulness.sleep()

    async def wait_activity(self) -> None:
        """See :meth:`Engine.wait_activity`."""
        await self._wakefulness.wait_activity()

    def _fall_asleep(self) -> None:
        """Free the model (blocking, in a worker thread; nothing holds the engine)."""
        raise NotImplementedError

    def _wake_up(self) -> None:
        """Load the model again (blocking, in a worker thread)."""
        raise NotImplementedError

    def _check_usable(self) -> None:
        if self._lost.is_set():
            raise DeviceLost("the engine failed and cannot serve requests")
        if self._interruption is not None:
            raise copy.copy(self._interruption)  # one instance per request: each gets its own traceback
        if self._closed:
            raise ServiceUnavailable("the model was unloaded", code="not_ready")

    @asynccontextmanager
    async def open_generation(
        self, request: GenerationRequest
    ) -> AsyncIterator[trio.MemoryReceiveChannel[EngineEvent]]:
        """Wait for a slot (FIFO), then stream the generation's events.

        Raises:
            DeviceLost: the engine was lost (before or while this request waited).
            BuboError: the engine was interrupted (before or while this request waited).

        """
        self._check_usable()
        request = self._with_scales(request)
        async with self.awake():
            slot = await self._acquire_slot(request)
            try:
                self._check_usable()
                task_id = self._next_task_id
                self._next_task_id += 1
                send, receive = trio.open_memory_channel[EngineEvent](self.channel_buffer)
                with receive, _unwrap_single_error():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._run_producer, slot, task_id, request, send)
                        try:
                            yield receive
                        finally:
                            # Whether the consumer read everything or left early, the
                            # producer must stop now; a finished producer ignores this.
                            nursery.cancel_scope.cancel()
            finally:
                self._pool.release(slot)

    def _with_scales(self, request: GenerationRequest) -> GenerationRequest:
        """*request* with every adapter's scale settled: its own, or the global ones now (llama-server's)."""
        if request.lora is None:
            return attrs.evolve(request, lora=self._lora_scales)
        if len(request.lora) != len(self._lora_paths):
            raise InvalidRequest(
                f"lora gives {len(request.lora)} scales; {len(self._lora_paths)} adapters are loaded",
                param="lora",
            )
        return request

    async def _acquire_slot(self, request: GenerationRequest) -> Slot:
        """Wait for a slot; an interruption meanwhile raises its error instead."""
        slot = None
        with trio.CancelScope() as waiting:
            self._interruptible.add(waiting)
            if self._interruption is not None:
                waiting.cancel()
            try:
                slot = await self._pool.acquire(
                    request.prompt_tokens, request.slot, adapter_set(request.lora or ())
                )
            finally:
                self._interruptible.discard(waiting)
        if slot is None:  # only interrupt() cancels this scope
            assert self._interruption is not None
            raise copy.copy(self._interruption)
        return slot

    def interrupt(self, error: BuboError) -> None:
        """End every generation with *error*: running ones as their last event, waiting ones as they wait.

        Later generations are refused with it too (shutdown: the deadline for
        running requests has passed).  Call on the trio thread.
        """
        self._interruption = error
        for scope in self._interruptible:
            scope.cancel()

    async def _run_producer(
        self,
        slot: Slot,
        task_id: int,
        request: GenerationRequest,
        send: trio.MemorySendChannel[EngineEvent],
    ) -> None:
        slot.begin(
            task_id, request.max_new_tokens, request.lora or (), prompt_length=len(request.prompt_tokens)
        )
        try:
            async with send:
                failure = None
                with trio.CancelScope() as running:
                    self._interruptible.add(running)
                    if self._interruption is not None:  # interrupted between admission and this start
                        running.cancel()
                    try:
                        await self._produce(slot, request, send)
                    except Exception as error:  # noqa: BLE001 - delivered to the consumer, not lost
                        failure = self._failure(error)  # sent outside the scope an interruption cancelled
                    finally:
                        self._interruptible.discard(running)
                if failure is not None:
                    await send.send(GenerationFailed(error=failure))
                elif running.cancelled_caught and self._interruption is not None:
                    await send.send(GenerationFailed(error=copy.copy(self._interruption)))
        finally:
            slot.end()

    @abc.abstractmethod
    async def _produce(
        self, slot: Slot, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        """Run one generation while *slot* is held."""

    # ---- slot files: each action holds the idle slot, so no generation starts in it meanwhile ----

    async def save_slot(self, slot_id: int, path: Path) -> SlotFile:
        """See :meth:`Engine.save_slot`."""
        async with self.awake():
            with self._holding(slot_id) as slot:
                return await self._save_slot(slot, path)

    async def restore_slot(self, slot_id: int, path: Path) -> SlotFile:
        """See :meth:`Engine.restore_slot`."""
        async with self.awake():
            with self._holding(slot_id) as slot:
                return await self._restore_slot(slot, path)

    async def erase_slot(self, slot_id: int) -> int:
        """See :meth:`Engine.erase_slot`."""
        async with self.awake():
            with self._holding(slot_id) as slot:
                return await self._erase_slot(slot)

    @contextlib.contextmanager
    def _holding(self, slot_id: int) -> Iterator[Slot]:
        self._check_usable()
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

    def statistics(self) -> EngineStatistics:
        """A snapshot of the totals and of every slot."""
        totals = self._totals
        slots = tuple(slot.statistics() for slot in self._pool.slots)
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
            requests_processing=self._pool.held,
            requests_deferred=self._pool.waiting,
            kv_cache_tokens=self._kv_used(),
            kv_cache_capacity=self._kv_capacity(),
            kv_cache_tokens_running=self._kv_used_by(self._pool.held_slots),
            prompt_tokens_waiting=self._pool.waiting_tokens
            + sum(slot.prompt_unread for slot in self._pool.slots),
            slots=slots,
        )

    def _kv_capacity(self) -> int:
        """Tokens the KV cache holds, all slots together (a unified cache: one context's worth)."""
        return self._info.n_ctx

    def _kv_used(self) -> int:
        """Cells the slots' sequences hold (an engine whose slots share cells counts each once)."""
        return self._kv_used_by(self._pool.slots)

    def _kv_used_by(self, slots: Sequence[Slot]) -> int:
        """Cells the sequences of *slots* hold (an engine whose slots share cells counts each once)."""
        return sum(slot.n_cached for slot in slots)

    def cache_contents(self) -> CacheContents:
        """What the prompt cache holds (engines with snapshots say more)."""
        return CacheContents(live_tokens=self._kv_used(), budget_bytes=0)

    async def aclose(self) -> None:
        """Wait until no request runs or waits, then close; later requests are refused."""
        await self._pool.wait_idle()
        await self._wakefulness.settled()
        self._closed = True
        self._retired.set()
        await trio.to_thread.run_sync(self.close)

    @abc.abstractmethod
    def compile_grammar(self, spec: GrammarSpec) -> str:
        """GBNF text for *spec* (see :meth:`Engine.compile_grammar`)."""

    def prepare_sampling(self, sampling: SamplingParams) -> None:  # noqa: B027 - optional: most have nothing to do
        """Nothing to prepare unless a subclass says so (see :meth:`Engine.prepare_sampling`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the engine holds; the engine is unusable afterwards."""

    def _lose(self, reason: str) -> None:
        """A fatal failure: the engine serves nothing more (call on the trio thread)."""
        if not self._lost.is_set():
            logger.critical("the engine failed and is lost: %s", reason)
        self._lost.set()
        self._retired.set()

    def _lose_to_a_stuck_thread(self, reason: str) -> None:
        """The engine's thread is stuck in a native call: lose the engine and end every request on it.

        Nothing that thread holds will be handed back, so the generations running
        on it and the requests waiting for a slot end now with 503 ``device_lost``
        rather than when their clients give up (call on the trio thread).
        """
        self._lose(reason)
        self.interrupt(DeviceLost(f"the engine is lost: {reason}"))

    def _failure(self, error: Exception) -> BuboError:
        """What the consumer is told (call on the trio thread); only a fatal engine error loses the engine.

        A bug (any other exception) fails its own request with a 500: engines
        reset what the failed generation left in their state before it gets here.
        """
        if isinstance(error, EngineFailure) and error.fatal:
            self._lose(error.message)
            return DeviceLost("the engine failed while generating and cannot serve requests")
        if isinstance(error, BuboError):
            logger.error("generation failed: %s", error.message)
            return error
        logger.error("generation failed unexpectedly", exc_info=error)
        return InternalError("the engine failed on this request")


class _unwrap_single_error:  # noqa: N801 - used like a function, as contextlib helpers are
    """Let the one real error out of a one-producer nursery's ExceptionGroup.

    The nursery around a generation holds exactly one background task, so its
    strict ExceptionGroup has at most one error that is not ``Cancelled`` (the
    producer's, or the consumer's).  Callers expect that error itself, e.g. an
    :class:`EngineFailure` for the dialect's error envelope.  A group of only
    ``Cancelled`` is left alone for trio's cancel scopes to absorb.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if not isinstance(exc, BaseExceptionGroup):
            return
        _, errors = exc.split(trio.Cancelled)
        if errors is None:
            return
        leaves = _leaves(errors)
        if len(leaves) == 1:
            raise leaves[0]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out
