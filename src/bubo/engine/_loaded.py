"""A loaded model's native side as one record: built at once by :func:`load`, freed at once by its close.

:func:`load` creates, in this order, the model's weights (and the LoRA adapters
llama.cpp frees with them), the context with one KV sequence per slot, the
draft model (``--model-draft``: its weights and context), the image projector
(``--mmproj``), the embedding context (``--embeddings``, or an encoder), and
the decode loop over the context (its thread starts with the first request).
Each free is registered in one :class:`contextlib.ExitStack` as its resource
is created, so a load that fails at any step frees what it had made, each
thing once, in reverse order, and raises.  A load that succeeds moves the
stack into the :class:`LoadedModel`; :meth:`LoadedModel.close` stops the
decode thread, then closes that stack: the live sequences go to the disk
tier, then the embedding context, the projector, the draft model, the context
and the weights are freed.  A stack frees once, so a second close frees
nothing again.

Sleeping is :meth:`LoadedModel.close` and forgetting the record; waking is
:func:`load` again, with the engine's :class:`~._lasting.Lasting` (what the
first load learnt, and what outlives a sleep).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import llama_cpp

from bubo.domain.generation import GenerationRequest
from bubo.domain.modes import FlashAttention, KvCacheType
from bubo.machine import cpu_quota, usable_cpus

from ._beside import Beside
from ._context import LlamaContext
from ._courier import Courier, DirectPost, decide_courier
from ._decode_loop import DecodeLoop
from ._draft_model import DraftModel
from ._embedder import Embedder
from ._generation import EngineSetup
from ._image_decoder import ImageDecoder
from ._kv import SnapshotStore
from ._model_drafts import Drafter
from ._model_info import generates
from ._prefill_budget import PrefillBudget
from ._sampler import Sampler
from ._vision import Vision, VisionOptions
from .errors import EngineFailure

if TYPE_CHECKING:
    from ._lasting import Lasting
    from .llama import LlamaOptions

__all__ = [
    "CACHE_TYPES",
    "FLASH_ATTN",
    "ContextShape",
    "LoadedModel",
    "auto_parallel",
    "context_shape",
    "load",
]

logger = logging.getLogger(__name__)
llama_logger = logging.getLogger("bubo.llama_cpp")

FLASH_ATTN: Mapping[FlashAttention, int] = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_GGML_TYPE_BF16 = 30  # ggml.h's value; llama-cpp-python's binding names no constant for it
CACHE_TYPES: Mapping[KvCacheType, int] = {
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

AUTO_PARALLEL = 4
"""Slots when ``--parallel`` is auto (llama-server's default)..."""
MIN_AUTO_SLOT_CTX = 256
"""...unless the context is too small to give each at least this many tokens."""


def auto_parallel(n_ctx: int) -> int:
    """The slots ``--parallel -1`` means for a context of *n_ctx* tokens."""
    return max(1, min(AUTO_PARALLEL, n_ctx // MIN_AUTO_SLOT_CTX))


@attrs.frozen(eq=False, kw_only=True)
class LoadedModel:
    """Everything native one load made, and the decode loop that alone touches the context.

    The parts are read by the engine; only :meth:`close` frees them.
    """

    model: object  # llama_model*, with its LoRA adapters
    context: LlamaContext
    draft: DraftModel | None
    vision: Vision | None  # the projector (--mmproj)
    embedder: Embedder | None  # the embedding context
    loop: DecodeLoop
    setup: EngineSetup  # what each generation is given
    _resources: contextlib.ExitStack = attrs.field(alias="resources", repr=False)

    def close(self, timeout_s: float) -> bool:
        """Stop the decode thread, then free everything (once); False, freeing nothing, if it is stuck.

        (Its courier then has ``COURIER_STOP_S`` more to post what the thread left.)
        A thread that does not stop within *timeout_s* is inside llama.cpp and may
        still touch the context: freeing it under the thread would crash the
        process, so it is left allocated for the process's exit to free.
        """
        if not self.loop.stop(timeout_s):
            return False
        self._resources.close()
        return True


@attrs.frozen
class ContextShape:
    """The context's parameters over a model, its tokens per slot and its slots."""

    params: llama_cpp.llama_context_params
    per_slot: int
    n_parallel: int


def context_shape(options: LlamaOptions, model: object) -> ContextShape:
    """The context *options* ask for over *model* (unified: the slots share it; else one each)."""
    params = llama_cpp.llama_context_default_params()
    per_slot = options.n_ctx or llama_cpp.llama_model_n_ctx_train(model)
    n_parallel = auto_parallel(per_slot) if options.n_parallel < 1 else options.n_parallel
    params.n_ctx = per_slot if options.kv_unified else per_slot * n_parallel
    params.n_batch = options.n_batch
    params.n_ubatch = options.n_ubatch
    params.n_seq_max = n_parallel
    params.kv_unified = options.kv_unified
    params.n_threads = options.n_threads
    params.n_threads_batch = options.n_threads_batch or options.n_threads
    params.flash_attn_type = FLASH_ATTN[options.flash_attn]
    params.type_k = CACHE_TYPES[options.cache_type_k]
    params.type_v = CACHE_TYPES[options.cache_type_v]
    params.no_perf = True
    # A sliding-window model keeps only its window of KV unless told to keep it all;
    # the prompt cache needs the whole sequence to trim it to a common prefix.
    params.swa_full = llama_cpp.llama_model_n_swa(model) > 0
    return ContextShape(params, per_slot, n_parallel)


def load(
    options: LlamaOptions,
    lasting: Lasting,
    *,
    on_lost: Callable[[EngineFailure], None],
    on_progress: Callable[[float], None] | None = None,
) -> LoadedModel:
    """Load everything *options* ask for (blocking: call from a worker thread).

    *on_lost* is the decode loop's (called on its thread when it can serve
    nothing more); *on_progress* hears the weights' load fraction.

    Raises:
        EngineFailure: llama.cpp could not load or create one of the parts (what was made is freed).

    """
    with contextlib.ExitStack() as resources:
        model = _load_weights(options, on_progress)
        resources.callback(llama_cpp.llama_model_free, model)  # the adapters go with it
        adapters = tuple(_load_adapter(model, lora.path) for lora in options.lora)
        shape = context_shape(options, model)
        snapshots = SnapshotStore(options.cache_ram_mib * 1024 * 1024) if options.cache_ram_mib > 0 else None
        context = LlamaContext(
            model,
            shape.params,
            totals=lasting.totals,
            snapshots=snapshots,
            reuse_chunk=options.cache_reuse,
            adapters=adapters,
            disk=lasting.disk_tier(shape.params),
        )
        resources.callback(context.close)
        resources.callback(_persist, context)  # runs before the context is freed
        draft = _load_draft(model, shape, options)
        if draft is not None:
            resources.callback(draft.close)
        prior = 1.0 if draft is None else draft.size_bytes / max(1, llama_cpp.llama_model_size(model))
        drafting = lasting.drafting_policy(prior)
        vision = _open_vision(options, model)
        if vision is not None:
            resources.callback(vision.close)
            context.images = ImageDecoder(vision.projector)
        embedder = None
        if options.embeddings or not generates(model, context.ctx):  # an encoder serves nothing else
            embedder = Embedder(
                model,
                n_tokens=options.n_ubatch,
                n_threads=options.n_threads_batch or options.n_threads,
                pooling=options.pooling,
            )
            resources.callback(embedder.close)
        vocabulary = lasting.tokens(context)
        cpu_free = _cpu_free_beside_decode(options)
        setup = EngineSetup(
            context=context,
            pieces=vocabulary.pieces,
            eog=vocabulary.eog,
            sampler=functools.partial(_sampler, context),
            drafting=drafting,
            drafter=None if draft is None or drafting is None else Drafter(draft.context, drafting),
            context_shift=options.context_shift,
            defer_takes=cpu_free,
        )
        loop = DecodeLoop(
            context,
            prefill=PrefillBudget(
                fixed=options.prefill_chunk or None,
                n_batch=context.n_batch,
                target_gap_s=options.prefill_gap_ms / 1000.0,
                min_chunk=options.n_ubatch // 2,
            ),
            drafting=drafting,
            to_trio=Courier() if cpu_free else DirectPost(),
            beside=Beside() if cpu_free else None,
            park_idle=(
                options.cache_idle_slots
                and options.kv_unified
                and shape.n_parallel > 1
                and snapshots is not None
            ),
            on_lost=on_lost,
        )
        return LoadedModel(
            model=model,
            context=context,
            draft=draft,
            vision=vision,
            embedder=embedder,
            loop=loop,
            setup=setup,
            resources=resources.pop_all(),
        )


def _cpu_free_beside_decode(options: LlamaOptions) -> bool:
    """Whether a CPU is free for work beside ``llama_decode`` (``--courier``), as the log says.

    Then the decode thread's events reach trio through a courier thread, and
    each token's bookkeeping that can wait runs on a thread of its own during
    the next decode.
    """
    courier = decide_courier(
        options.courier,
        n_threads=options.n_threads,
        cpus=usable_cpus(quota=cpu_quota()),
        gpu_layers=options.n_gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload()),
    )
    logger.info(
        "events to the event loop: %s (%s)",
        "courier, tokens taken beside llama_decode" if courier.enabled else "direct",
        courier.reason,
    )
    return courier.enabled


def _load_weights(options: LlamaOptions, on_progress: Callable[[float], None] | None) -> object:
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


def _load_draft(model: object, shape: ContextShape, options: LlamaOptions) -> DraftModel | None:
    """The draft model, its context shaped as the main one (one sequence per slot), or None.

    Raises:
        EngineFailure: it does not load, or its vocabulary is not the model's (``IncompatibleDraft``).

    """
    if options.draft_model_path is None:
        return None
    params = llama_cpp.llama_context_params.from_buffer_copy(shape.params)
    n_ctx = options.n_ctx_draft or shape.per_slot
    params.n_ctx = n_ctx if options.kv_unified else n_ctx * shape.n_parallel
    draft = DraftModel(
        options.draft_model_path,
        model,
        params,
        n_gpu_layers=options.n_gpu_layers_draft,
        repack=options.repack.enabled,
    )
    logger.info("draft model: %s (%d-token context)", options.draft_model_path, draft.context.n_ctx)
    return draft


def _open_vision(options: LlamaOptions, model: object) -> Vision | None:
    """The image projector over *model* (``--mmproj``), or None for a model that reads text only.

    Raises:
        ProjectorRefused: the projector cannot serve this model.

    """
    if options.mmproj is None:
        return None
    return Vision(
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


def _persist(context: LlamaContext) -> None:
    """Queue the live sequences for the disk tier (the decode thread has stopped: they are this thread's)."""
    for cache in context.caches:
        cache.persist()


def _sampler(context: LlamaContext, request: GenerationRequest) -> Sampler:
    """*request*'s sampler chain (on the decode thread: the DRY stage was prepared before)."""
    return Sampler(
        request.sampling,
        n_vocab=context.n_vocab,
        n_ctx=context.n_ctx_seq,
        vocab=context.vocab,
        grammar=request.grammar,
        dry=context.dry,
    )


def _llama_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if text:
        llama_logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text.decode(errors="replace").rstrip())


# llama.cpp keeps this pointer for the life of the process: it must never be collected.
_LLAMA_LOG_CALLBACK = llama_cpp.llama_log_callback(_llama_log)


def _route_llama_logs() -> None:
    """Send llama.cpp's own log lines to Python logging (process-wide in llama.cpp)."""
    llama_cpp.llama_log_set(_LLAMA_LOG_CALLBACK, ctypes.c_void_p())
