"""The llama.cpp engine, driven through llama-cpp-python's low-level C API.

One model, one context, one session slot.  A generation runs in a trio worker
thread (``abandon_on_cancel=False``: the thread owns the context until it
returns); tokens reach trio through the slot's memory channel.  The thread
checks for cancellation between prefill chunks and after every token, so a
client that leaves stops the decode within one chunk or one token.

Events are handed to trio without waiting (``TrioToken.run_sync_soon``): a
blocking round trip per token cost 0.28 ms of a 9.4 ms step on the reference
machine.  The channel is therefore unbounded, but a generation's events are
bounded by its context length, and the decode never waits for a slow client.

The KV cache keeps the previous request's tokens; a new request evaluates only
what follows the longest common prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import trio

from bubo.domain.generation import (
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStats,
    GrammarSpec,
    PromptProgress,
    StopCause,
)
from bubo.domain.sampling import SamplingParams
from bubo.errors import BuboError

from ._context import LlamaContext, token_piece
from ._draft_policy import DraftOptions, DraftPolicy
from ._generation import Generation, Outcome
from ._grammar import to_gbnf
from ._kv import SnapshotStore
from ._sampler import Sampler
from .base import (
    CacheContents,
    EngineCounters,
    EngineFailure,
    GrammarRejected,
    ModelInfo,
    RepackDecision,
    SlotEngine,
)

__all__ = ["DraftOptions", "LlamaEngine", "LlamaOptions", "load_llama_engine"]

logger = logging.getLogger(__name__)
llama_logger = logging.getLogger("bubo.llama_cpp")

_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
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
    prefill_chunk: int = 256  # tokens per llama_decode call while prefilling (cancel granularity)
    flash_attn: str = "auto"  # auto | on | off
    n_gpu_layers: int = -1  # -1: all that fit (no effect on a CPU build)
    use_mmap: bool = True
    cache_ram_mib: int = 1024  # prompt-cache snapshots in host RAM; 0 turns them off
    drafting: DraftOptions = attrs.field(factory=DraftOptions)
    # llama.cpp's CPU extra buffer types (AMX, CPU_REPACK); bubo.engine.probe decides
    repack: RepackDecision = attrs.field(
        factory=lambda: RepackDecision(enabled=True, reason="llama.cpp's default")
    )


def load_llama_engine(
    options: LlamaOptions, on_progress: Callable[[float], None] | None = None
) -> LlamaEngine:
    """Load the model and create its context.  Blocking: call from a worker thread.

    Raises:
        EngineFailure: llama.cpp could not load the model or create the context.

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
    try:
        return LlamaEngine(model, options)
    except BaseException:
        llama_cpp.llama_model_free(model)
        raise


def _llama_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if text:
        llama_logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text.decode(errors="replace").rstrip())


# llama.cpp keeps this pointer for the life of the process: it must never be collected.
_LLAMA_LOG_CALLBACK = llama_cpp.llama_log_callback(_llama_log)


def _route_llama_logs() -> None:
    """Send llama.cpp's own log lines to Python logging (process-wide in llama.cpp)."""
    llama_cpp.llama_log_set(_LLAMA_LOG_CALLBACK, ctypes.c_void_p())


class LlamaEngine(SlotEngine):
    """A loaded model with one context and one slot."""

    channel_buffer = math.inf  # events are bounded by the context; see the module's docstring

    def __init__(self, model: object, options: LlamaOptions) -> None:
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = options.n_ctx
        context_params.n_batch = options.n_batch
        context_params.n_ubatch = options.n_ubatch
        context_params.n_seq_max = 1
        context_params.n_threads = options.n_threads
        context_params.n_threads_batch = options.n_threads_batch or options.n_threads
        context_params.flash_attn_type = _FLASH_ATTN[options.flash_attn]
        context_params.no_perf = True
        # A sliding-window model keeps only its window of KV unless told to keep it all;
        # the prompt cache needs the whole sequence to trim it to a common prefix.
        context_params.swa_full = llama_cpp.llama_model_n_swa(model) > 0
        counters = EngineCounters()
        snapshots = SnapshotStore(options.cache_ram_mib * 1024 * 1024) if options.cache_ram_mib > 0 else None
        self._context = LlamaContext(
            model,
            context_params,
            counters=counters,
            snapshots=snapshots,
            batch_capacity=max(options.drafting.draft_max + 1, 1),
        )
        self._model = model
        # drafting statistics outlive a request: they describe the model, the machine and the workload
        self._drafting = DraftPolicy(options.drafting) if options.drafting.draft_max > 0 else None
        vocab = self._context.vocab
        n_vocab = self._context.n_vocab
        self._prefill_chunk = max(1, min(options.prefill_chunk, options.n_batch))
        self._pieces = [token_piece(vocab, token) for token in range(n_vocab)]
        description = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, description, len(description))
        super().__init__(
            ModelInfo(
                path=str(options.model_path),
                architecture=_meta(model, "general.architecture"),
                n_ctx=self._context.n_ctx,
                n_ctx_train=llama_cpp.llama_model_n_ctx_train(model),
                n_vocab=n_vocab,
                n_embd=llama_cpp.llama_model_n_embd(model),
                n_params=llama_cpp.llama_model_n_params(model),
                size_bytes=llama_cpp.llama_model_size(model),
                vocab_type=llama_cpp.llama_vocab_type(vocab),
                description=description.value.decode(errors="replace"),
                eog_token_ids=frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)),
                repack=options.repack,
            ),
            counters=counters,
        )

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

    def check_decode(self, batch: int = 64) -> None:
        """Decode a prompt of *batch* tokens, then one more token, and forget them (the start-up probe).

        These are the two shapes of work a server does first (a prefill and a
        decode step), so a kernel that crashes on this CPU crashes here.

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
            context.forget()

    def token_piece(self, token: int) -> bytes:
        """The bytes llama.cpp renders for *token* (control tokens render empty)."""
        return self._pieces[token]

    def cache_contents(self) -> CacheContents:
        """The live slot and the snapshots held in host RAM (read on the trio thread: a snapshot)."""
        store = self._context.cache.store
        return CacheContents(
            live_tokens=len(self._context.cache.tokens),
            budget_bytes=store.budget_bytes if store is not None else 0,
            snapshots=tuple(store.snapshots()) if store is not None else (),
        )

    # ---- the generation, on the worker thread -------------------------------------------

    async def _produce(self, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]) -> None:
        trio_token = trio.lowlevel.current_trio_token()

        def emit(event: EngineEvent) -> None:
            trio_token.run_sync_soon(_deliver, send, event)  # FIFO, before the thread's own result

        outcome = await trio.to_thread.run_sync(
            self._generate_safely, request, emit, thread_name="bubo-decode"
        )
        warm_up = self._warm_up_job(request, outcome)
        if warm_up is not None:
            self._schedule_idle(warm_up)

    def _warm_up_job(self, request: GenerationRequest, outcome: Outcome) -> Callable[[], None] | None:
        """Evaluating the end of turn the next prompt will start with, once the slot is free.

        Only after an answer the client will send back as it is (it ended, or hit
        its token limit): then the next turn's prompt continues with the last
        generated token and the template's end of turn.  A request that takes
        the slot first makes the job stale, and it does nothing.
        """
        if not request.continuation or outcome.cause not in (StopCause.EOS, StopCause.LIMIT):
            return None
        last = outcome.undecoded
        tokens = (
            (last,) if last is not None and last not in self._info.eog_token_ids else ()
        ) + request.continuation
        cache = self._context.cache
        if len(cache.tokens) + len(tokens) >= self._context.n_ctx:
            return None
        version = cache.version

        def warm_up() -> None:  # an EngineFailure goes to run_idle_work, on the trio thread
            if cache.version != version:  # another request used the slot meanwhile
                return
            self._context.decode(tokens)

        return warm_up

    def _generate_safely(self, request: GenerationRequest, emit: Callable[[EngineEvent], None]) -> Outcome:
        """Generate; after an unexpected error forget the sequence, which it may have left half-written."""
        try:
            return self._generate_blocking(request, emit)
        except BuboError:
            raise  # EngineFailure cleans up after itself; the others are raised before decoding
        except Exception:
            self._context.forget()
            raise

    def _generate_blocking(self, request: GenerationRequest, emit: Callable[[EngineEvent], None]) -> Outcome:
        context = self._context
        counters = self._counters
        prompt = request.prompt_tokens
        if not prompt or len(prompt) >= context.n_ctx:  # the service checks first; this guards the engine
            msg = f"prompt of {len(prompt)} tokens cannot be evaluated in a {context.n_ctx}-token context"
            raise EngineFailure(msg)

        started = time.perf_counter()
        n_cached, cache_report = context.cache.prepare(prompt, request.cache_tags)
        counters.kv_tokens = n_cached
        counters.task_prompt_cached = n_cached
        for start in range(n_cached, len(prompt), self._prefill_chunk):
            trio.from_thread.check_cancelled()
            chunk = prompt[start : start + self._prefill_chunk]
            context.decode(chunk)
            counters.task_prompt_processed += len(chunk)
            emit(
                PromptProgress(
                    total=len(prompt),
                    cached=n_cached,
                    processed=start + len(chunk) - n_cached,
                    elapsed_ms=(time.perf_counter() - started) * 1000.0,
                )
            )
        prompt_done = time.perf_counter()
        prompt_ms = (prompt_done - started) * 1000.0
        counters.prompt_tokens += len(prompt) - n_cached
        counters.prompt_tokens_cached += n_cached
        counters.prompt_seconds += prompt_ms / 1000.0

        generation = Generation(
            context,
            request,
            pieces=self._pieces,
            eog=self._info.eog_token_ids,
            counters=counters,
            drafting=self._drafting,
            emit=emit,
        )
        outcome = None
        try:
            outcome = generation.run()
        finally:
            predicted_ms = (time.perf_counter() - prompt_done) * 1000.0
            counters.tokens_predicted += counters.task_decoded
            counters.tokens_predicted_seconds += predicted_ms / 1000.0
        emit(
            GenerationFinished(
                cause=outcome.cause,
                stop_word=outcome.stop_word,
                stats=GenerationStats(
                    prompt_tokens=len(prompt),
                    cached_tokens=n_cached,
                    prompt_ms=prompt_ms,
                    completion_tokens=outcome.n_generated,
                    predicted_ms=predicted_ms,
                    draft_tokens=outcome.drafted,
                    draft_accepted=outcome.accepted,
                    cache=cache_report,
                ),
            )
        )
        return outcome

    def close(self) -> None:
        """Free the context and the model."""
        self._context.close()
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None


def _deliver(send: trio.MemorySendChannel[EngineEvent], event: EngineEvent) -> None:
    """Put *event* in the (unbounded) channel, on the trio thread; a consumer that left drops it."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        send.send_nowait(event)


def _meta(model: object, key: str) -> str:
    buffer = ctypes.create_string_buffer(256)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode(errors="replace") if size >= 0 else ""
