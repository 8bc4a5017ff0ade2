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
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import llama_cpp
import numpy as np
import trio

from bubo.domain.generation import EngineEvent, GenerationRequest, GrammarSpec, StopCause
from bubo.domain.modes import FlashAttention, KvCacheType, Pooling
from bubo.domain.sampling import SamplingParams
from bubo.errors import DeviceLost

from ._backlog import BACKLOG_BYTES, MIB, EventBacklog, backlog_limit
from ._context import LlamaContext, token_piece
from ._crossing import RELEASE_WAIT_S, SLOT_ACTION_WAIT_S, cross, post_to_trio
from ._decode_loop import DecodeLoop
from ._disk_cache import DiskTier, kv_identity
from ._draft_model import DraftModel
from ._draft_policy import DraftOptions, DraftPolicy
from ._embedder import Embedder
from ._generation import EngineSetup, Generation, Outcome
from ._grammar import to_gbnf
from ._kv import SnapshotStore, saved_token_count
from ._kv_plan import DiskOffer
from ._model_drafts import Drafter
from ._prefill_budget import DEFAULT_GAP_S, PrefillBudget
from ._sampler import Sampler, dry_key
from ._vision import Vision, VisionOptions
from .base import (
    CacheContents,
    EngineFailure,
    FimTokens,
    GrammarRejected,
    ModelInfo,
    RepackDecision,
    SlotEngine,
    SlotFile,
    SlotFileNoRoom,
    SnapshotInfo,
)
from .lora import LoraAdapter, LoraFile, adapter_set
from .slots import EMPTY_MIRROR, Slot
from .stats import EngineCounters

__all__ = ["DraftOptions", "LlamaEngine", "LlamaOptions", "LoraFile", "load_llama_engine"]

logger = logging.getLogger(__name__)
llama_logger = logging.getLogger("bubo.llama_cpp")

_FLASH_ATTN: Mapping[FlashAttention, int] = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_GGML_TYPE_BF16 = 30  # ggml.h's value; llama-cpp-python's binding names no constant for it
_CACHE_TYPES: Mapping[KvCacheType, int] = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": _GGML_TYPE_BF16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
}
# ggml log levels -> logging levels; llama.cpp's INFO chatter goes to DEBUG
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


@attrs.frozen(kw_only=True)
class LlamaOptions:
    """How to load the model and size the context (llama-server's flags)."""

    model_path: Path
    n_ctx: int = 0  # 0: the model's training context
    n_threads: int = 2
    n_threads_batch: int | None = None  # None: same as n_threads
    n_batch: int = 2048
    n_ubatch: int = 512
    prefill_chunk: int = 0  # prompt tokens per decode step; 0: sized to keep streams under prefill_gap_ms
    prefill_gap_ms: float = DEFAULT_GAP_S * 1000.0  # the streams' gap a prompt read beside them may take
    n_parallel: int = 1  # session slots, one KV sequence each; -1: auto (auto_parallel)
    kv_unified: bool = True  # the slots share n_ctx; else each has n_ctx of its own
    slot_prompt_similarity: float = 0.1  # a cached prefix longer than this share of a prompt picks the slot
    flash_attn: FlashAttention = "auto"
    cache_type_k: KvCacheType = "f16"  # the KV cache's data types; a quantized V needs flash attention
    cache_type_v: KvCacheType = "f16"
    n_gpu_layers: int = -1  # -1: all that fit (no effect on a CPU build)
    use_mmap: bool = True
    cache_ram_mib: int = 1024  # prompt-cache snapshots in host RAM; 0 turns them off
    cache_idle_slots: bool = True  # idle slots' sequences go to those snapshots as generations start
    cache_disk_dir: Path | None = None  # prompt-cache snapshot files (a directory per model and settings)
    cache_disk_mib: int = 0  # their byte budget, over every model's directory; 0: no disk tier
    cache_disk_max_age_days: float = 7.0  # another model's (settings') directory unused this long is deleted
    embeddings: bool = False  # a second context serves embeddings (inputs of up to n_ubatch tokens)
    pooling: Pooling | None = None  # the embeddings' pooling; None: the model's
    mmproj: Path | None = None  # the image projector (--mmproj); None: the model reads text only
    mmproj_output_width: int | None = None  # its width as its file says (checked before mtmd reads it)
    mmproj_offload: bool = True  # the projector on the GPU where there is one
    image_min_tokens: int | None = None  # a dynamic-resolution projector's bounds; None: its own
    image_max_tokens: int | None = None
    image_max_pixels: int = 33_554_432  # the largest image read (width times height), checked before decoding
    image_max_count: int = 32  # the most images one request may hold
    drafting: DraftOptions = attrs.field(factory=DraftOptions)
    draft_model_path: Path | None = None  # a draft model drafts instead of prompt lookup (--model-draft)
    n_ctx_draft: int = 0  # the draft context's tokens per slot; 0: as the main context's
    n_gpu_layers_draft: int = -1
    # llama.cpp's CPU extra buffer types (AMX, CPU_REPACK); bubo.engine.probe decides
    repack: RepackDecision = attrs.field(
        factory=lambda: RepackDecision(enabled=True, reason="llama.cpp's default")
    )
    context_shift: bool = False  # go on past the end of the context by dropping old tokens (llama-server's)
    max_unread_mib: int = BACKLOG_BYTES // MIB  # what a request's unread events may hold before it is ended
    cache_reuse: int = 0  # after a changed middle, move cached runs of at least this many tokens (0: off)
    # LoRA adapters, by id, with their first global scales; each was checked against the model before
    # (bubo.model.check_lora_adapter: llama.cpp must never see one that does not fit)
    lora: tuple[LoraFile, ...] = ()


T = TypeVar("T")

AUTO_PARALLEL = 4
"""Slots when ``--parallel`` is auto (llama-server's default)..."""
MIN_AUTO_SLOT_CTX = 256
"""...unless the context is too small to give each at least this many tokens."""


def auto_parallel(n_ctx: int) -> int:
    """The slots ``--parallel -1`` means for a context of *n_ctx* tokens."""
    return max(1, min(AUTO_PARALLEL, n_ctx // MIN_AUTO_SLOT_CTX))


def load_llama_engine(
    options: LlamaOptions, on_progress: Callable[[float], None] | None = None
) -> LlamaEngine:
    """Load the model and create its context.  Blocking: call from a worker thread.

    Raises:
        EngineFailure: llama.cpp could not load the model or create the context.

    """
    model = _load_model(options, on_progress)
    try:
        adapters = [_load_adapter(model, lora.path) for lora in options.lora]
        return LlamaEngine(model, options, adapters)
    except BaseException:
        llama_cpp.llama_model_free(model)  # frees the adapters loaded for it too
        raise


def _load_model(options: LlamaOptions, on_progress: Callable[[float], None] | None) -> object:
    """The model's weights, loaded as *options* say (blocking).

    Raises:
        EngineFailure: llama.cpp could not load the model.

    """
    _route_llama_logs()
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model_params.n_gpu_layers = options.n_gpu_layers
    model_params.use_mmap = options.use_mmap
    model_params.use_extra_bufts = options.repack.enabled

    def progress(fraction: float, _user_data: ctypes.c_void_p) -> bool:
        if on_progress is not None:
            on_progress(fraction)
        return True

    callback = llama_cpp.llama_progress_callback(progress)  # kept alive until load returns
    model_params.progress_callback = callback
    model = llama_cpp.llama_model_load_from_file(str(options.model_path).encode(), model_params)
    if not model:
        raise EngineFailure(f"llama.cpp could not load the model {options.model_path}")
    return model


def _load_adapter(model: object, path: Path) -> object:
    """A LoRA adapter for *model*; llama.cpp frees it with the model.

    Raises:
        EngineFailure: llama.cpp refused the file.

    """
    adapter = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
    if not adapter:
        raise EngineFailure(f"llama.cpp could not load the LoRA adapter {path} (its log says why)")
    return adapter


def _llama_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if text:
        llama_logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text.decode(errors="replace").rstrip())


# llama.cpp keeps this pointer for the life of the process: it must never be collected.
_LLAMA_LOG_CALLBACK = llama_cpp.llama_log_callback(_llama_log)


def _route_llama_logs() -> None:
    """Send llama.cpp's own log lines to Python logging (process-wide in llama.cpp)."""
    llama_cpp.llama_log_set(_LLAMA_LOG_CALLBACK, ctypes.c_void_p())


class LlamaEngine(SlotEngine):
    """A loaded model with one context and ``n_parallel`` slots."""

    channel_buffer = math.inf  # the unread events are bounded by _backlog instead; see the module's docstring
    release_wait_s = RELEASE_WAIT_S
    slot_action_wait_s = SLOT_ACTION_WAIT_S

    can_sleep = True

    def __init__(self, model: object, options: LlamaOptions, adapters: Sequence[object] = ()) -> None:
        """*adapters*: the LoRA adapters loaded for *model*, one for each of ``options.lora``."""
        self._options = options
        self.backlog_bytes = options.max_unread_mib * MIB  # a request's unread events; past it it is ended
        self._model: object | None = model
        self._adapters = tuple(adapters)  # freed by llama.cpp with the model, so loaded again with it
        self._totals = EngineCounters()
        self._draft: DraftModel | None = None
        # drafting statistics outlive a request and a sleep: they describe the model, the machine, the work
        self._drafting: DraftPolicy | None = None
        self._drafter: Drafter | None = None
        # the disk tier outlives a sleep: its files and its writer thread belong to the engine
        identity = _state_identity(options, self._context_params(model)[0])
        self._disk = _disk_tier(options, identity)
        self._trio_token: trio.lowlevel.TrioToken | None = None  # the run requests last came from
        try:
            context = self._create_context(model)
        except BaseException:
            if self._disk is not None:
                self._disk.close()
            raise
        vocab = context.vocab
        n_vocab = context.n_vocab
        self._pieces = [token_piece(vocab, token) for token in range(n_vocab)]
        description = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, description, len(description))
        super().__init__(
            ModelInfo(
                path=str(options.model_path),
                architecture=_meta(model, "general.architecture"),
                n_ctx=context.n_ctx_seq,
                n_ctx_train=llama_cpp.llama_model_n_ctx_train(model),
                n_vocab=n_vocab,
                n_embd=llama_cpp.llama_model_n_embd(model),
                n_params=llama_cpp.llama_model_n_params(model),
                size_bytes=llama_cpp.llama_model_size(model),
                vocab_type=llama_cpp.llama_vocab_type(vocab),
                description=description.value.decode(errors="replace"),
                eog_token_ids=frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)),
                repack=options.repack,
                n_batch=context.n_batch,
                fim=_fim_tokens(vocab),
                draft_model=None if self._draft is None else str(self._draft.path),
                context_shift=options.context_shift,
                state_identity=identity,
                generates=_generates(model, context.ctx),
            ),
            n_slots=len(context.caches),
            similarity=options.slot_prompt_similarity,
            totals=self._totals,
            lora=[
                LoraAdapter(id=i, path=str(lora.path), scale=lora.scale)
                for i, lora in enumerate(options.lora)
            ],
        )
        self._connect(model)

    def _context_params(self, model: object) -> tuple[llama_cpp.llama_context_params, int, int]:
        """The context's parameters over *model*, the tokens per slot and the slots."""
        options = self._options
        context_params = llama_cpp.llama_context_default_params()
        # unified: the slots share the context; else each slot has a context of its own of n_ctx tokens
        per_slot = options.n_ctx or llama_cpp.llama_model_n_ctx_train(model)
        n_parallel = auto_parallel(per_slot) if options.n_parallel < 1 else options.n_parallel
        context_params.n_ctx = per_slot if options.kv_unified else per_slot * n_parallel
        context_params.n_batch = options.n_batch
        context_params.n_ubatch = options.n_ubatch
        context_params.n_seq_max = n_parallel
        context_params.kv_unified = options.kv_unified
        context_params.n_threads = options.n_threads
        context_params.n_threads_batch = options.n_threads_batch or options.n_threads
        context_params.flash_attn_type = _FLASH_ATTN[options.flash_attn]
        context_params.type_k = _CACHE_TYPES[options.cache_type_k]
        context_params.type_v = _CACHE_TYPES[options.cache_type_v]
        context_params.no_perf = True
        # A sliding-window model keeps only its window of KV unless told to keep it all;
        # the prompt cache needs the whole sequence to trim it to a common prefix.
        context_params.swa_full = llama_cpp.llama_model_n_swa(model) > 0
        return context_params, per_slot, n_parallel

    def _create_context(self, model: object) -> LlamaContext:
        """The context over *model* and its decode loop (``_context``, ``_loop``), beside the disk tier."""
        options = self._options
        context_params, per_slot, n_parallel = self._context_params(model)
        snapshots = SnapshotStore(options.cache_ram_mib * 1024 * 1024) if options.cache_ram_mib > 0 else None
        context = self._context = LlamaContext(
            model,
            context_params,
            totals=self._totals,
            snapshots=snapshots,
            reuse_chunk=options.cache_reuse,
            adapters=self._adapters,
            disk=self._disk,
        )
        try:
            draft = self._draft = _load_draft(
                model, context_params, options, per_slot=per_slot, n_parallel=n_parallel
            )
        except BaseException:
            context.close()
            raise
        if options.drafting.draft_max > 0 and self._drafting is None:
            prior = 1.0 if draft is None else draft.size_bytes / max(1, llama_cpp.llama_model_size(model))
            self._drafting = DraftPolicy(options.drafting, draft_cost_prior=prior)
        drafter = None if draft is None or self._drafting is None else Drafter(draft.context, self._drafting)
        self._drafter = drafter
        self._loop = DecodeLoop(
            context,
            prefill=PrefillBudget(
                fixed=options.prefill_chunk or None,
                n_batch=context.n_batch,
                target_gap_s=options.prefill_gap_ms / 1000.0,
                min_chunk=options.n_ubatch // 2,
            ),
            drafting=self._drafting,
            park_idle=(
                options.cache_idle_slots
                and bool(context_params.kv_unified)
                and n_parallel > 1
                and snapshots is not None
            ),
            on_lost=self._loop_lost,
        )
        return context

    def _connect(self, model: object) -> None:
        """Give the slots and the generations the context just created; open the embedder beside it."""
        options, context = self._options, self._context
        self._setup = EngineSetup(
            context=context,
            pieces=self._pieces,
            eog=self._info.eog_token_ids,
            sampler=self._sampler_for,
            drafting=self._drafting,
            drafter=self._drafter,
            context_shift=options.context_shift,
        )
        for slot, cache in zip(self.slots, context.caches, strict=True):
            slot.mirror = cache
        try:
            self._open_vision(model)
        except BaseException:
            self._close_draft()
            context.close()
            raise
        context.projector = self.vision.projector if isinstance(self.vision, Vision) else None
        if isinstance(self.embedder, Embedder):
            try:
                self.embedder.open(model)
            except BaseException:
                self._close_vision()
                self._close_draft()
                context.close()
                raise
        elif options.embeddings or not self._info.generates:  # an encoder serves nothing else
            try:
                self.embedder = Embedder(
                    model,
                    n_tokens=options.n_ubatch,
                    n_threads=options.n_threads_batch or options.n_threads,
                    pooling=options.pooling,
                )
            except BaseException:
                self._close_vision()
                self._close_draft()
                context.close()
                raise

    def _open_vision(self, model: object) -> None:
        """Open the image projector over *model* (``--mmproj``): again after a sleep, or the first time."""
        options = self._options
        if isinstance(self.vision, Vision):
            self.vision.open(model)
        elif options.mmproj is not None:
            self.vision = Vision(
                VisionOptions(
                    path=options.mmproj,
                    use_gpu=options.mmproj_offload,
                    n_threads=options.n_threads_batch or options.n_threads,
                    image_min_tokens=options.image_min_tokens,
                    image_max_tokens=options.image_max_tokens,
                    max_pixels=options.image_max_pixels,
                    max_images=options.image_max_count,
                    n_ubatch=options.n_ubatch,
                    output_width=options.mmproj_output_width,
                ),
                model,
            )

    def _close_vision(self) -> None:
        if isinstance(self.vision, Vision):
            self.vision.close()  # kept: it opens again over the next model (vision is None: text only)

    # ---- sleeping while idle: the weights, the context, the embedder and the projector go ----

    def _fall_asleep(self) -> None:
        """Stop the decode thread, then free the context, the embedder and the weights (nothing holds them).

        Raises:
            EngineFailure: the decode thread did not stop (stuck in llama.cpp: nothing is freed).

        """
        if not self._release():
            raise EngineFailure(f"the decode thread did not stop within {self.release_wait_s:g} s")
        for slot in self.slots:
            slot.mirror = EMPTY_MIRROR

    def _wake_up(self) -> None:
        """Load the weights and create the context again, as at the start (the prompt cache starts empty).

        Raises:
            EngineFailure: llama.cpp could not load the model or create the context.

        """
        model = _load_model(self._options, None)
        try:
            self._adapters = tuple(_load_adapter(model, lora.path) for lora in self._options.lora)
            self._create_context(model)
            self._connect(model)
        except BaseException:
            llama_cpp.llama_model_free(model)
            raise
        self._model = model

    def _release(self) -> bool:
        """Stop the decode thread and free what the model holds; False (nothing freed) if it is stuck.

        The live sequences are queued for the disk tier first (its writer goes on: it is the engine's).
        """
        if not self._loop.stop(self.release_wait_s):
            return False
        if self._disk is not None:
            for cache in self._context.caches:  # the thread has stopped: this one owns the context now
                cache.persist()
        self._context.close()
        self._close_draft()
        if isinstance(self.embedder, Embedder):
            self.embedder.close()  # kept: it opens again over the next model (embedder is None: not served)
        self._close_vision()
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None
        return True

    def compile_grammar(self, spec: GrammarSpec) -> str:
        """GBNF text for *spec*, checked by building (and freeing) a sampler with it.

        Raises:
            GrammarRejected: a schema cannot be converted, or llama.cpp cannot parse the result.

        """
        context = self._context
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
        if sampling.mirostat != 0 or "dry" not in sampling.samplers:
            return
        context = self._context
        key = dry_key(sampling, context.n_ctx_seq)
        if key is not None and not self.sleeping:
            with contextlib.suppress(EngineFailure):  # freed meanwhile: the model fell asleep
                context.dry.prepare(key)

    def check_decode(self, batch: int = 64) -> None:
        """Decode a prompt of *batch* tokens, then one more token, and forget them (the start-up probe).

        These are the two shapes of work a server does first (a prefill and a
        decode step), so a kernel that crashes on this CPU crashes here.  Call
        before any request: the decode thread does not run yet.

        Raises:
            EngineFailure: a decode failed or its logits are not finite.

        """
        context = self._context
        text = "The quick brown fox jumps over the lazy dog. " * batch
        tokens = context.tokenize(text)[:batch]
        try:
            context.decode(tokens)
            context.decode((int(np.argmax(context.logits(-1))),))
            if not np.isfinite(context.logits(-1)).all():
                raise EngineFailure("the probe decode produced logits that are not finite")
        finally:
            context.caches[0].clear()

    def _kv_capacity(self) -> int:
        return self._context.n_ctx

    def _kv_used(self) -> int:
        return self._context.cells_used

    def _kv_used_by(self, slots: Sequence[Slot]) -> int:
        caches = self._context.caches
        return self._context.ledger.used_by({caches[slot.id].seq_id for slot in slots})

    def token_piece(self, token: int) -> bytes:
        """The bytes llama.cpp renders for *token* (control tokens render empty)."""
        return self._pieces[token]

    def cache_contents(self) -> CacheContents:
        """The live slots, the snapshots in host RAM and the disk tier's files (read on the trio thread)."""
        disk = self._disk
        disk_budget = disk.budget_bytes if disk is not None else 0
        on_disk = tuple(
            SnapshotInfo(
                n_tokens=len(e.tokens),
                size_bytes=e.size_bytes,
                conversation=None,
                last_used=e.last_used,
                tier="disk",
            )
            for e in (disk.entries() if disk is not None else ())
        )
        if self.sleeping:  # the live slots and host RAM were freed with the model; the disk tier stays
            return CacheContents(
                live_tokens=0,
                budget_bytes=self._options.cache_ram_mib * 1024 * 1024,
                disk_budget_bytes=disk_budget,
                disk_snapshots=on_disk,
            )
        caches = self._context.caches
        store = caches[0].store
        return CacheContents(
            live_tokens=self._context.cells_used,
            budget_bytes=store.budget_bytes if store is not None else 0,
            snapshots=tuple(store.snapshots()) if store is not None else (),
            disk_budget_bytes=disk_budget,
            disk_snapshots=on_disk,
        )

    # ---- a generation on the decode thread ----------------------------------------------------

    def _sampler_for(self, request: GenerationRequest) -> Sampler:
        """*request*'s sampler chain (on the decode thread: the DRY stage was prepared before)."""
        context = self._context
        return Sampler(
            request.sampling,
            n_vocab=context.n_vocab,
            n_ctx=context.n_ctx_seq,
            vocab=context.vocab,
            grammar=request.grammar,
            dry=context.dry,
        )

    async def _produce(
        self, slot: Slot, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        trio_token = self._trio_token = trio.lowlevel.current_trio_token()

        def let_go() -> None:  # on the trio thread: the client left too many events unread
            generation.cancelled = True
            self._loop.wake()

        backlog = EventBacklog(send, limit=backlog_limit(request.n_probs, self.backlog_bytes), end=let_go)

        def emit(event: EngineEvent) -> None:  # on the decode thread
            post_to_trio(trio_token, backlog.deliver, event)  # FIFO, before the generation's end

        offer = await self._read_from_disk(slot, request)
        make = functools.partial(Generation, self._setup, slot, request, emit=emit, offer=offer)
        # its stop strings' automaton is built with it: in a worker thread, off the event loop
        generation = await trio.to_thread.run_sync(make) if request.stop else make()
        ended = trio.Event()
        failures: list[BaseException] = []

        def on_end(error: BaseException | None) -> None:  # on the decode thread
            try:
                if error is not None:
                    failures.append(error)
                elif generation.outcome is not None:
                    self._warm_up_later(slot, request, generation.outcome)
                    if self._disk is not None:
                        self._loop.schedule_idle(self._context.caches[slot.id].persist)
            finally:
                post_to_trio(trio_token, ended.set)  # whatever happened above: the producer must hear

        self._loop.submit(generation, on_end)
        try:
            await ended.wait()
        finally:
            if not ended.is_set():  # the client left, or shutdown's deadline passed
                generation.cancelled = True
                self._loop.wake()
                await self._wait_released(ended)
        if failures:
            raise failures[0]
        if backlog.overflowed and not generation.done:
            raise backlog.error()

    async def _wait_released(self, ended: trio.Event) -> None:
        """Wait (shielded, at most :attr:`release_wait_s`) for the thread to let go of a cancelled generation.

        It does so at its next step, after the current token or prompt chunk.
        A thread that takes longer is stuck (inside llama.cpp): the engine is
        lost, and the request fails instead of holding its slot for good.  Once
        the engine is lost there is nothing to wait for: a loop that still runs
        has ended every generation, and a stuck one lets go of none.

        Raises:
            DeviceLost: the engine is lost.
            EngineFailure: the thread did not let go in time.

        """
        if self.lost:
            raise DeviceLost("the engine was lost while this request was generating")
        with trio.move_on_after(self.release_wait_s, shield=True):
            await ended.wait()
        if not ended.is_set():
            message = f"the decode thread did not let go of a request within {self.release_wait_s:g} s"
            self._lose_to_a_stuck_thread(message)
            raise EngineFailure(message + "; the engine is lost")

    async def _read_from_disk(self, slot: Slot, request: GenerationRequest) -> DiskOffer | None:
        """The best snapshot file for the prompt, read and checked, if it beats host RAM and the slots.

        In a worker thread (reading and checking a file takes milliseconds to seconds).  The
        offer goes to the request's own generation, and the decode thread restores it when
        the generation starts, if it is still the best source.
        """
        if self._disk is None or not request.cache_prompt or not self._disk.total_bytes:
            return None
        cache = self._context.caches[slot.id]
        return await trio.to_thread.run_sync(
            cache.read_from_disk,
            request.prompt_tokens,
            self._context.n_ctx_seq,
            adapter_set(request.lora or ()),
        )

    def _warm_up_later(self, slot: Slot, request: GenerationRequest, outcome: Outcome) -> None:
        """Queue the next turn's warm-up (on the decode thread); a failure costs only the warm-up."""
        try:
            self._schedule_warm_up(slot, request, outcome)
        except Exception:
            logger.exception("the next turn's warm-up could not be queued; it starts cold")

    def _schedule_warm_up(self, slot: Slot, request: GenerationRequest, outcome: Outcome) -> None:
        """Evaluate the end of turn the next prompt will start with, once no generation is active.

        Called on the decode thread as the generation ends (so a client that
        leaves right after its last token still gets its next turn warm).  Only
        after an answer the client will send back as it is (it ended, or hit
        its token limit): then the next turn's prompt continues with the last
        generated token and the template's end of turn.  A request that uses
        the slot first makes the job stale, and it does nothing.
        """
        if (
            not request.continuation
            or outcome.shifted  # the next prompt cannot reuse a shifted sequence
            or outcome.cause not in (StopCause.EOS, StopCause.LIMIT)
        ):
            return
        last = outcome.undecoded
        tokens = (
            (last,) if last is not None and last not in self._info.eog_token_ids else ()
        ) + request.continuation
        cache = self._context.caches[slot.id]
        if len(cache.tokens) + len(tokens) >= self._context.n_ctx_seq:
            return
        version = cache.version

        def warm_up() -> None:  # on the decode thread, with no generation active
            if cache.version != version:  # another request used the slot
                return
            self._context.decode(tokens, cache.seq_id)
            slot.holds(len(cache.tokens))

        self._loop.schedule_idle(warm_up)

    # ---- slot files: run on the decode thread, between two steps of the other slots --------------

    async def _save_slot(self, slot: Slot, path: Path) -> SlotFile:
        cache = self._context.caches[slot.id]

        def save() -> SlotFile:
            n_bytes = cache.save_file(path)  # first: it drops the cells a context shift moved
            slot.holds(len(cache.tokens))
            return SlotFile(n_tokens=len(cache.tokens), n_bytes=n_bytes, adapters=cache.adapters)

        return await self._on_loop(save, "a slot save")

    async def _restore_slot(self, slot: Slot, path: Path) -> SlotFile:
        cache = self._context.caches[slot.id]
        scales = self._lora_scales

        def restore() -> SlotFile:
            context = self._context
            try:
                n_bytes = cache.load_file(path, context.n_ctx_seq)
            except EngineFailure:
                needed = saved_token_count(path)
                room = context.n_ctx - context.cells_used
                shared = context.n_ctx_seq == context.n_ctx and len(context.caches) > 1
                if shared and needed is not None and room < needed <= context.n_ctx_seq:
                    raise SlotFileNoRoom(
                        f"{path.name} holds {needed} tokens; the context the slots share has room for "
                        f"{room} now: retry when other requests have finished"
                    ) from None
                raise
            cache.adapters = adapter_set(scales)  # taken as computed under the scales in force now
            slot.holds(len(cache.tokens))
            return SlotFile(n_tokens=len(cache.tokens), n_bytes=n_bytes, adapters=cache.adapters)

        return await self._on_loop(restore, "a slot restore")

    async def _erase_slot(self, slot: Slot) -> int:
        cache = self._context.caches[slot.id]

        def erase() -> int:
            n_tokens = len(cache.tokens)
            cache.clear()
            return n_tokens

        return await self._on_loop(erase, "a slot erase")

    async def _on_loop(self, function: Callable[[], T], what: str) -> T:
        """*function*'s result, run on the decode thread between two steps (bounded: :mod:`._crossing`)."""
        self._trio_token = trio.lowlevel.current_trio_token()
        return await cross(
            self._loop.post,
            function,
            what=what,
            start_within_s=self.release_wait_s,
            finish_within_s=self.slot_action_wait_s,
            lose=self._lose_to_a_stuck_thread,
        )

    async def settle(self) -> None:
        """Return once the idle work queued so far (warm-ups) has run, or the engine closed.

        Idle work waits for every generation to end, so only the wait for the
        thread to take up this last, empty job is unbounded (and cancellable).
        """
        self._trio_token = trio.lowlevel.current_trio_token()
        with contextlib.suppress(EngineFailure):  # refused: nothing more will run
            await cross(
                self._loop.post_idle,
                lambda: None,
                what="waiting for idle work",
                start_within_s=math.inf,
                finish_within_s=self.release_wait_s,
                lose=self._lose,
            )

    def _loop_lost(self, failure: EngineFailure) -> None:
        """The decode loop can serve nothing more (on the decode thread): the engine is lost."""
        if self._trio_token is not None:
            post_to_trio(self._trio_token, self._lose, failure.message)

    def close(self) -> None:
        """Stop the decode thread, then free the context and the model.

        A thread that does not stop within :attr:`release_wait_s` is stuck in
        llama.cpp: the context and the model are then left allocated (freeing
        them under it would crash the process), for the process's exit to free.
        """
        if self._model is not None and not self._release():
            logger.critical(
                "the decode thread did not stop within %g s; the model stays in memory until exit",
                self.release_wait_s,
            )
        if self._disk is not None:
            self._disk.close()  # the writer drains what is queued, the live sequences' files among it

    def _close_draft(self) -> None:
        if self._draft is not None:
            self._draft.close()
            self._draft = None


def _load_draft(
    model: object,
    params: llama_cpp.llama_context_params,
    options: LlamaOptions,
    *,
    per_slot: int,
    n_parallel: int,
) -> DraftModel | None:
    """The draft model, its context shaped as the main one (one sequence per slot), or None.

    Raises:
        EngineFailure: it does not load, or its vocabulary is not the model's (``IncompatibleDraft``).

    """
    if options.draft_model_path is None:
        return None
    draft_params = llama_cpp.llama_context_params.from_buffer_copy(params)
    n_ctx = options.n_ctx_draft or per_slot
    draft_params.n_ctx = n_ctx if options.kv_unified else n_ctx * n_parallel
    draft = DraftModel(
        options.draft_model_path,
        model,
        draft_params,
        n_gpu_layers=options.n_gpu_layers_draft,
        repack=options.repack.enabled,
    )
    logger.info("draft model: %s (%d-token context)", options.draft_model_path, draft.context.n_ctx)
    return draft


def _state_identity(options: LlamaOptions, params: llama_cpp.llama_context_params) -> str:
    """The fingerprint of a KV state of this model under these settings (slot files, the disk tier).

    It covers what changes the KV cells a state holds: the model file's content, llama.cpp's
    version and state format, the KV types (``-ctk``/``-ctv``), flash attention, the
    sliding-window and unified caches, RoPE, the LoRA adapter files in id order (a state
    records its adapter set as ids and scales, which mean the same cells only over the same
    files), and the image projector with its token bounds (an image's cells are its
    embeddings).  Not the context size: a prefix's cells do not depend on it.  Blocking: it reads
    samples of the model and adapter files (:func:`kv_identity`).
    """
    settings = {
        "llama_cpp": llama_cpp.__version__,
        "state_seq": [llama_cpp.LLAMA_STATE_SEQ_MAGIC, llama_cpp.LLAMA_STATE_SEQ_VERSION],
        "type_k": params.type_k,
        "type_v": params.type_v,
        "flash_attn": options.flash_attn,
        "swa_full": bool(params.swa_full),
        "kv_unified": bool(params.kv_unified),
        "rope": [
            params.rope_scaling_type,
            params.rope_freq_base,
            params.rope_freq_scale,
            params.yarn_ext_factor,
            params.yarn_attn_factor,
            params.yarn_beta_fast,
            params.yarn_beta_slow,
            params.yarn_orig_ctx,
        ],
        "lora": [kv_identity(lora.path, {}) for lora in options.lora],
    }
    if options.mmproj is not None:  # an image's cells are its projector's embeddings (text-only: unchanged)
        settings["mmproj"] = [
            kv_identity(options.mmproj, {}),
            options.image_min_tokens,
            options.image_max_tokens,
        ]
    return kv_identity(options.model_path, settings)


def _disk_tier(options: LlamaOptions, identity: str) -> DiskTier | None:
    """The prompt cache's disk tier, in a directory of its own for *identity* (:func:`_state_identity`).

    Files longer than the context are not offered.  A directory that cannot be made costs only
    the disk tier.
    """
    if options.cache_disk_dir is None or options.cache_disk_mib <= 0:
        return None
    try:
        return DiskTier(
            options.cache_disk_dir,
            identity=identity,
            budget_bytes=options.cache_disk_mib << 20,
            max_age_s=options.cache_disk_max_age_days * 86400.0,
        )
    except OSError as error:
        logger.warning("the prompt cache has no disk tier: %s", error)
        return None


def _generates(model: object, ctx: object) -> bool:
    """Whether *model* can generate text: a decoder whose context attends causally (not BERT's kind)."""
    return bool(llama_cpp.llama_model_has_decoder(model)) and bool(llama_cpp.llama_get_causal_attn(ctx))


def _meta(model: object, key: str) -> str:
    buffer = ctypes.create_string_buffer(256)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode(errors="replace") if size >= 0 else ""


def _fim_tokens(vocab: object) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens, as llama.cpp found them (metadata or token texts)."""

    def token(value: int) -> int | None:
        return None if value < 0 else value  # LLAMA_TOKEN_NULL is -1

    pre = token(llama_cpp.llama_vocab_fim_pre(vocab))
    suf = token(llama_cpp.llama_vocab_fim_suf(vocab))
    mid = token(llama_cpp.llama_vocab_fim_mid(vocab))
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(
        pre=pre,
        suf=suf,
        mid=mid,
        rep=token(llama_cpp.llama_vocab_fim_rep(vocab)),
        sep=token(llama_cpp.llama_vocab_fim_sep(vocab)),
    )
