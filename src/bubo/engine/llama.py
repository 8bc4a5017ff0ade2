"""The llama.cpp engine, driven through llama-cpp-python's low-level C API.

One model, one context, ``n_parallel`` session slots, each with its own KV
sequence.  One decode thread (:mod:`._decode_loop`) drives every active
generation (:mod:`._generation`), one batch a step; tokens reach trio through
each request's memory channel.  A client that leaves marks its generation
cancelled; the thread lets go of it at its next step, and only then is the
slot given back.

Events are handed to trio without waiting (``TrioToken.run_sync_soon``): a
blocking round trip per token would cost every step a wake-up of the event
loop, and the decode never waits for a slow client.  The channel itself is
therefore unbounded; the events its client has not read are counted instead
(:mod:`._backlog`), and past their bound the generation is ended.

Each slot's KV sequence keeps its previous request's tokens; a new request
evaluates only what follows the longest common prefix (or a snapshot's, from
host RAM or, with a disk tier, from a file read before the request reaches
the decode thread).

What the engine owns: the slots and their queue (:class:`~.base.SlotEngine`)
and its current load (:class:`~._current_load.CurrentLoad`: everything
native, as one :class:`~._loaded.LoadedModel` freed by its one close and None
while the model sleeps; what outlives a sleep; the ports the service holds).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import trio

from bubo.domain.generation import EngineEvent, GenerationRequest, GrammarSpec
from bubo.domain.modes import CourierMode, FlashAttention, KvCacheType, Pooling
from bubo.domain.sampling import SamplingParams

from ._backlog import MIB
from ._cache_report import cache_contents
from ._context import check_decode
from ._crossing import RELEASE_WAIT_S, SLOT_ACTION_WAIT_S, cross
from ._current_load import CurrentLoad
from ._draft_policy import DraftOptions
from ._dry_stages import dry_key
from ._grammar import to_gbnf
from ._life import EngineLife
from ._loaded import LoadedModel
from ._model_info import describe
from ._ports import EmbeddingModel, ImageReader
from ._producer import produce
from ._sampler import Sampler
from ._sequence_jobs import erase_job, restore_job, save_job
from .base import SlotEngine
from .errors import EngineFailure, GrammarRejected, Lost
from .lora import LoraAdapter, LoraFile
from .slots import Slot
from .values import CacheContents, RepackDecision, SlotFile

__all__ = ["DraftOptions", "LlamaEngine", "LlamaOptions", "LoraFile", "load_llama_engine"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class LlamaOptions:
    """How to load the model and size the context (llama-server's flags).

    No field that a setting gives has a default: its default is the setting's, in ``config.py``,
    and ``bubo.loader.llama_options`` gives every one (the engine may not import ``config``).
    """

    model_path: Path
    n_ctx: int  # 0: the model's training context
    n_threads: int
    n_threads_batch: int | None  # None: same as n_threads
    n_batch: int
    n_ubatch: int
    prefill_chunk: int  # prompt tokens per decode step; 0: sized to keep streams under prefill_gap_ms
    prefill_gap_ms: float  # the streams' gap a prompt read beside them may take
    n_parallel: int  # session slots, one KV sequence each; -1: auto (auto_parallel)
    kv_unified: bool  # the slots share n_ctx; else each has n_ctx of its own
    slot_prompt_similarity: float  # a cached prefix longer than this share of a prompt picks the slot
    flash_attn: FlashAttention
    cache_type_k: KvCacheType  # the KV cache's data types; a quantized V needs flash attention
    cache_type_v: KvCacheType
    n_gpu_layers: int  # -1: all that fit (no effect on a CPU build)
    use_mmap: bool = True  # no setting: llama-server's --no-mmap is not offered
    cache_ram_mib: int  # prompt-cache snapshots in host RAM; 0 turns them off
    cache_idle_slots: bool  # idle slots' sequences go to those snapshots as generations start
    cache_disk_dir: Path | None  # prompt-cache snapshot files (a directory per model and settings)
    cache_disk_mib: int  # their byte budget, over every model's directory; 0: no disk tier
    cache_disk_max_age_days: float  # another model's (settings') directory unused this long is deleted
    embeddings: bool  # a second context serves embeddings (inputs of up to n_ubatch tokens)
    pooling: Pooling | None  # the embeddings' pooling; None: the model's
    mmproj: Path | None  # the image projector (--mmproj); None: the model reads text only
    mmproj_output_width: int | None  # its width as its file says (checked before mtmd reads it)
    mmproj_offload: bool  # the projector on the GPU where there is one
    image_min_tokens: int | None  # a dynamic-resolution projector's bounds; None: its own
    image_max_tokens: int | None
    image_max_pixels: int  # the largest image read (width times height), checked before decoding
    image_max_count: int  # the most images one request may hold
    drafting: DraftOptions
    draft_model_path: Path | None  # a draft model drafts instead of prompt lookup (--model-draft)
    n_ctx_draft: int  # the draft context's tokens per slot; 0: as the main context's
    n_gpu_layers_draft: int
    # llama.cpp's CPU extra buffer types (AMX, CPU_REPACK); bubo.engine.probe decides (the loader evolves)
    repack: RepackDecision = attrs.field(
        factory=lambda: RepackDecision(enabled=True, reason="llama.cpp's default")
    )
    context_shift: bool  # go on past the end of the context by dropping old tokens (llama-server's)
    max_unread_mib: int  # what a request's unread events may hold before it is ended
    cache_reuse: int  # after a changed middle, move cached runs of at least this many tokens (0: off)
    courier: CourierMode  # the decode thread's events reach trio through a courier thread (engine/_courier)
    # LoRA adapters, by id, with their first global scales; each was checked against the model before
    # (bubo.model.check_lora_adapter: llama.cpp must never see one that does not fit)
    lora: tuple[LoraFile, ...]


T = TypeVar("T")


def load_llama_engine(
    options: LlamaOptions, on_progress: Callable[[float], None] | None = None
) -> LlamaEngine:
    """Load the model and create its context.  Blocking: call from a worker thread.

    Raises:
        EngineFailure: llama.cpp could not load the model or create a part (what was made is freed).

    """
    return LlamaEngine(options, on_progress)


class LlamaEngine(SlotEngine):
    """A loaded model with one context and ``n_parallel`` slots."""

    channel_buffer = math.inf  # the unread events are bounded by _backlog instead; see the module's docstring
    release_wait_s = RELEASE_WAIT_S
    slot_action_wait_s = SLOT_ACTION_WAIT_S

    can_sleep = True

    def __init__(self, options: LlamaOptions, on_progress: Callable[[float], None] | None = None) -> None:
        """Load what *options* ask for (blocking; see :func:`load_llama_engine`)."""
        self._options = options
        self.backlog_bytes = options.max_unread_mib * MIB  # a request's unread events; past it it is ended
        life = EngineLife()
        self.current_load = CurrentLoad(options, lose=life.lose, on_progress=on_progress)
        loaded, lasting = self.current_load.current, self.current_load.lasting
        vocabulary = lasting.tokens(loaded.context)  # read by the first load
        assert lasting.identity is not None  # set by the first load
        self._pieces = vocabulary.pieces
        self._n_cells = loaded.context.n_ctx  # the KV cache's capacity, the same after a sleep
        # typed by the protocols the engine promises: mypy holds each port to its protocol
        self.embedder: EmbeddingModel | None = self.current_load.embedder
        self.vision: ImageReader | None = self.current_load.vision
        try:
            super().__init__(
                describe(
                    loaded.model, loaded.context, options, vocabulary=vocabulary, identity=lasting.identity
                ),
                n_slots=len(loaded.context.caches),
                similarity=options.slot_prompt_similarity,
                totals=lasting.totals,
                lora=[LoraAdapter(id=i, path=str(f.path), scale=f.scale) for i, f in enumerate(options.lora)],
                life=life,
            )
            self.current_load.serve(self.slots)
        except BaseException:
            self.current_load.close(self.release_wait_s)
            raise

    @property
    def current(self) -> LoadedModel:
        """The current load (see :attr:`CurrentLoad.current`: raises while the model sleeps)."""
        return self.current_load.current

    # ---- sleeping while idle: the load is closed and forgotten, and made again (:mod:`._current_load`) --

    def _fall_asleep(self) -> None:
        self.current_load.fall_asleep(self.release_wait_s)

    def _wake_up(self) -> None:
        self.current_load.wake_up()

    def close(self) -> None:
        """Stop the decode thread, free the load, stop the disk tier's writer (:meth:`CurrentLoad.close`)."""
        self.current_load.close(self.release_wait_s)

    # ---- what requests ask before and beside their generation ---------------------------------

    def compile_grammar(self, spec: GrammarSpec) -> str:
        """GBNF text for *spec*, checked by building (and freeing) a sampler with it.

        Raises:
            GrammarRejected: a schema cannot be converted, or llama.cpp cannot parse the result.

        """
        context = self.current.context
        gbnf = to_gbnf(spec)
        try:
            Sampler(SamplingParams(), n_vocab=context.n_vocab, vocab=context.vocab, grammar=gbnf).close()
        except EngineFailure:
            raise GrammarRejected("llama.cpp could not parse the grammar") from None
        return gbnf

    def prepare_sampling(self, sampling: SamplingParams) -> None:
        """Build *sampling*'s DRY stage now if it has one (the decode thread then only clones it).

        Only a head start: a model that sleeps (its stages freed) leaves the building to the decode thread.
        """
        loaded = self.current_load.loaded
        if sampling.mirostat != 0 or "dry" not in sampling.samplers or loaded is None or self.sleeping:
            return
        key = dry_key(sampling, loaded.context.n_ctx_seq)
        if key is not None:
            with contextlib.suppress(EngineFailure):  # freed meanwhile: the model fell asleep
                loaded.context.dry.prepare(key)

    def check_decode(self, batch: int = 64) -> None:
        """The start-up probe's decode (:func:`~._context.check_decode`); before any request."""
        check_decode(self.current.context, batch)

    def _kv_capacity(self) -> int:
        return self._n_cells

    def _kv_used_by(self, slots: Sequence[Slot]) -> int:
        loaded = self.current_load.loaded  # none while the model sleeps
        if loaded is None:
            return 0
        caches = loaded.context.caches
        return loaded.context.ledger.used_by({caches[slot.id].seq_id for slot in slots})

    def token_piece(self, token: int) -> bytes:
        """The bytes llama.cpp renders for *token* (control tokens render empty)."""
        return self._pieces[token]

    def cache_contents(self) -> CacheContents:
        """The live slots, the snapshots in host RAM and the disk tier's files (read on the trio thread)."""
        loaded = self.current_load.loaded
        return cache_contents(
            None if loaded is None else loaded.context,
            self.current_load.lasting.disk,
            ram_budget_bytes=self._options.cache_ram_mib * 1024 * 1024,
        )

    # ---- a generation on the decode thread (:mod:`._producer`) --------------------------------

    async def _produce(
        self, slot: Slot, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        await produce(
            self.current_load.for_trio(),
            slot,
            request,
            send,
            disk=self.current_load.lasting.disk,
            backlog_bytes=self.backlog_bytes,
            released=self._wait_released,
        )

    async def _wait_released(self, ended: trio.Event) -> None:
        """Wait (shielded, at most :attr:`release_wait_s`) for the thread to let go of a cancelled generation.

        It does so at its next step, after the current token or prompt chunk.
        A thread that takes longer is stuck (inside llama.cpp): the engine is
        lost, and the request fails instead of holding its slot for good.  Once
        the engine is lost there is nothing to wait for: a loop that still runs
        has ended every generation, and a stuck one lets go of none.

        Raises:
            Lost: the engine is lost.
            EngineFailure: the thread did not let go in time.

        """
        if self.lost:
            raise Lost("the engine was lost while this request was generating")
        with trio.move_on_after(self.release_wait_s, shield=True):
            await ended.wait()
        if not ended.is_set():
            message = f"the decode thread did not let go of a request within {self.release_wait_s:g} s"
            self.life.lose_to_a_stuck_thread(message)
            raise EngineFailure(message + "; the engine is lost")

    # ---- slot files: run on the decode thread, between two steps of the other slots --------------

    async def _save_slot(self, slot: Slot, path: Path) -> SlotFile:
        return await self._on_loop(save_job(self.current.context, slot, path), "a slot save")

    async def _restore_slot(self, slot: Slot, path: Path) -> SlotFile:
        job = restore_job(self.current.context, slot, path, self.lora.scales)
        return await self._on_loop(job, "a slot restore")

    async def _erase_slot(self, slot: Slot) -> int:
        return await self._on_loop(erase_job(self.current.context, slot), "a slot erase")

    async def _on_loop(self, function: Callable[[], T], what: str) -> T:
        """*function*'s result, run on the decode thread between two steps (bounded: :mod:`._crossing`)."""
        return await cross(
            self.current_load.for_trio().loop.post,
            function,
            what=what,
            start_within_s=self.release_wait_s,
            finish_within_s=self.slot_action_wait_s,
            lose=self.life.lose_to_a_stuck_thread,
        )

    async def settle(self) -> None:
        """Return once the idle work queued so far (warm-ups) has run, or the engine closed or sleeps.

        Idle work waits for every generation to end, so only the wait for the
        thread to take up this last, empty job is unbounded (and cancellable).
        """
        if self.current_load.loaded is None:  # asleep: no idle work is left
            return
        with contextlib.suppress(EngineFailure):  # refused: nothing more will run
            await cross(
                self.current_load.for_trio().loop.post_idle,
                lambda: None,
                what="waiting for idle work",
                start_within_s=math.inf,
                finish_within_s=self.release_wait_s,
                lose=self.life.lose,
            )
