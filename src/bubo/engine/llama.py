"""The llama.cpp engine, driven through llama-cpp-python's low-level C API.

One model, one context, one session slot.  A generation runs in a trio worker
thread (``abandon_on_cancel=False``: the thread owns the context until it
returns); tokens reach trio through the slot's memory channel.  The thread
checks for cancellation between prefill chunks and after every token, so a
client that leaves stops the decode within one chunk or one token.

The KV cache keeps the previous request's tokens; a new request evaluates only
what follows the longest common prefix.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import trio

from bubo.domain.generation import (
    CacheReport,
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStats,
    GrammarSpec,
    PromptProgress,
    StopCause,
    ThinkingBudget,
    TokenGenerated,
    TokenLogprob,
    TopLogprob,
)
from bubo.domain.sampling import SamplingParams

from ._grammar import to_gbnf
from ._sampler import Sampler
from ._stops import GeneratedText
from .base import EngineFailure, ModelInfo, SlotEngine

__all__ = ["LlamaEngine", "LlamaOptions", "load_llama_engine"]

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
        ctx = llama_cpp.llama_init_from_model(model, context_params)
        if not ctx:
            msg = f"llama.cpp could not create a context of {options.n_ctx} tokens"
            raise EngineFailure(msg)
        self._model = model
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        vocab = llama_cpp.llama_model_get_vocab(model)
        self._vocab = vocab
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self._n_vocab = n_vocab
        self._prefill_chunk = max(1, min(options.prefill_chunk, options.n_batch))
        self._pieces = [_token_piece(vocab, token) for token in range(n_vocab)]
        eog = frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        description = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, description, len(description))
        super().__init__(
            ModelInfo(
                path=str(options.model_path),
                architecture=_meta(model, "general.architecture"),
                n_ctx=llama_cpp.llama_n_ctx(ctx),
                n_ctx_train=llama_cpp.llama_model_n_ctx_train(model),
                n_vocab=n_vocab,
                n_embd=llama_cpp.llama_model_n_embd(model),
                n_params=llama_cpp.llama_model_n_params(model),
                size_bytes=llama_cpp.llama_model_size(model),
                vocab_type=llama_cpp.llama_vocab_type(vocab),
                description=description.value.decode(errors="replace"),
                eog_token_ids=eog,
            )
        )
        self._kv_tokens: list[int] = []  # what the KV cache holds for sequence 0, in order

    def check_grammar(self, grammar: GrammarSpec) -> None:
        """Build (and free) a sampler for *grammar*.

        Raises:
            EngineFailure: llama.cpp cannot parse it.

        """
        Sampler(SamplingParams(), n_vocab=self._n_vocab, vocab=self._vocab, grammar=to_gbnf(grammar)).close()

    def token_piece(self, token: int) -> bytes:
        """The bytes llama.cpp renders for *token* (control tokens render empty)."""
        return self._pieces[token]

    # ---- the generation, on the worker thread -------------------------------------------

    async def _produce(self, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]) -> None:
        await trio.to_thread.run_sync(self._generate_blocking, request, send, thread_name="bubo-decode")

    def _generate_blocking(
        self, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        def emit(event: EngineEvent) -> None:
            trio.from_thread.run(send.send, event)  # back-pressure; raises Cancelled

        counters = self._counters
        prompt = request.prompt_tokens
        n_ctx = self._info.n_ctx
        if not prompt or len(prompt) >= n_ctx:  # the service checks first; this guards the engine
            msg = f"prompt of {len(prompt)} tokens cannot be evaluated in a {n_ctx}-token context"
            raise EngineFailure(msg)

        started = time.perf_counter()
        n_cached, cache_report = self._reuse_prefix(prompt)
        counters.task_prompt_cached = n_cached
        for start in range(n_cached, len(prompt), self._prefill_chunk):
            trio.from_thread.check_cancelled()
            chunk = prompt[start : start + self._prefill_chunk]
            self._decode(chunk)
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

        n_generated = 0
        cause = StopCause.LIMIT
        text = GeneratedText(request.stop)
        try:
            n_generated, cause = self._sample_loop(request, text, emit)
        finally:
            predicted_ms = (time.perf_counter() - prompt_done) * 1000.0
            counters.tokens_predicted += n_generated
            counters.tokens_predicted_seconds += predicted_ms / 1000.0
        emit(
            GenerationFinished(
                cause=cause,
                stop_word=text.matched,
                stats=GenerationStats(
                    prompt_tokens=len(prompt),
                    cached_tokens=n_cached,
                    prompt_ms=prompt_ms,
                    completion_tokens=n_generated,
                    predicted_ms=predicted_ms,
                    cache=cache_report,
                ),
            )
        )

    def _sample_loop(
        self,
        request: GenerationRequest,
        text: GeneratedText,
        emit: Callable[[EngineEvent], None],
    ) -> tuple[int, StopCause]:
        budget = _Budget(request, n_ctx=self._info.n_ctx)
        if budget.limit is not None and budget.limit <= 0:  # evaluate the prompt only
            return 0, StopCause.LIMIT
        counters = self._counters
        eog = frozenset() if request.ignore_eos else self._info.eog_token_ids
        grammar = to_gbnf(request.grammar) if request.grammar is not None else None
        sampler = Sampler(request.sampling, n_vocab=self._n_vocab, vocab=self._vocab, grammar=grammar)
        sampler.remember(request.prompt_tokens)
        thinking = _ThinkingClock(request.thinking_budget, self._tokenize)
        forced: list[int] = []  # tokens the engine inserts instead of sampling (end of thinking)
        n_generated = 0
        try:
            while True:
                if forced and sampler.allows(forced[0]):
                    token = forced.pop(0)
                    sampler.accept(token)
                else:
                    if forced:
                        logger.warning(
                            "the grammar does not admit the end of thinking here; budget not enforced"
                        )
                        forced.clear()
                    token = sampler.sample(self._ctx)
                n_generated += 1
                counters.task_decoded = n_generated
                logprob = None
                if token in eog:
                    cause: StopCause | None = StopCause.EOS
                    released = text.finish()
                else:
                    if request.n_probs is not None:
                        logprob = self._logprob(token, request.n_probs)
                    released = text.feed(self._pieces[token])
                    cause = budget.exhausted(n_generated, len(self._kv_tokens), text)
                    if cause is not None and text.matched is None:
                        released += text.finish()
                if text.matched is not None:
                    cause = StopCause.STOP_WORD
                emit(TokenGenerated(token_id=token, text=released, logprob=logprob))
                if cause is not None:
                    return n_generated, cause
                forced.extend(thinking.observe(text.recent))
                trio.from_thread.check_cancelled()
                self._decode((token,))
        finally:
            sampler.close()

    def _tokenize(self, text: str) -> tuple[int, ...]:
        data = text.encode()
        out = (llama_cpp.llama_token * (len(data) + 4))()
        count = llama_cpp.llama_tokenize(self._vocab, data, len(data), out, len(out), False, True)  # noqa: FBT003
        return tuple(out[: max(count, 0)])

    def _reuse_prefix(self, prompt: Sequence[int]) -> tuple[int, CacheReport]:
        """Trim the KV cache to its common prefix with *prompt*; return its length.

        At least the last prompt token is always evaluated again, since sampling
        needs its logits.
        """
        kv = self._kv_tokens
        was_empty = not kv
        limit = min(len(kv), len(prompt) - 1)
        keep = 0
        while keep < limit and kv[keep] == prompt[keep]:
            keep += 1
        if keep < len(kv) and not llama_cpp.llama_memory_seq_rm(self._memory, 0, keep, -1):
            # this memory cannot drop a suffix (recurrent state): start afresh
            llama_cpp.llama_memory_clear(self._memory, True)  # noqa: FBT003 - C API
            keep = 0
        del kv[keep:]
        self._counters.kv_tokens = len(kv)
        if keep:
            return keep, CacheReport(hit=True, miss_reason=None)
        return 0, CacheReport(hit=False, miss_reason="cold" if was_empty else "no_prefix")

    def _decode(self, tokens: Sequence[int]) -> None:
        """Evaluate *tokens* after what the KV cache holds; logits for the last one."""
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        status = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(array, len(tokens)))
        counters = self._counters
        counters.n_decode += 1
        if status != 0:
            # the failed batch may have left part of itself in the cache: forget it all
            llama_cpp.llama_memory_clear(self._memory, True)  # noqa: FBT003 - C API
            self._kv_tokens.clear()
            counters.kv_tokens = 0
            msg = f"llama_decode failed with status {status}"
            raise EngineFailure(msg)
        self._kv_tokens.extend(tokens)
        counters.kv_tokens = len(self._kv_tokens)
        counters.n_tokens_max = max(counters.n_tokens_max, len(self._kv_tokens))

    def _logprob(self, token: int, n_top: int) -> TokenLogprob:
        """Log-probabilities from the raw logits (llama-server's pre-sampling probs)."""
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        top: tuple[TopLogprob, ...] = ()
        if n_top > 0:
            n_top = min(n_top, self._n_vocab)
            candidates = np.argpartition(logits, -n_top)[-n_top:]
            ordered = candidates[np.argsort(logits[candidates])[::-1]]
            top = tuple(
                TopLogprob(
                    token_id=int(t),
                    piece=self._pieces[int(t)],
                    logprob=float(logits[t]) - log_total,
                )
                for t in ordered
            )
        return TokenLogprob(
            token_id=token,
            piece=self._pieces[token],
            logprob=float(logits[token]) - log_total,
            top=top,
        )

    def close(self) -> None:
        """Free the context and the model."""
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None


class _ThinkingClock:
    """Counts thinking tokens and says when to insert the end of thinking (``ThinkingBudget``)."""

    def __init__(self, spec: ThinkingBudget | None, tokenize: Callable[[str], tuple[int, ...]]) -> None:
        self._spec = spec
        self._tokenize = tokenize
        self._thinking = spec is not None and spec.started
        self._over = spec is None
        self._count = 0

    def observe(self, recent: str) -> tuple[int, ...]:
        """After each generated token: the tokens to insert now, if the budget is spent."""
        if self._over:
            return ()
        assert self._spec is not None
        if not self._thinking:
            self._thinking = self._spec.start_text in recent
            return ()
        if self._spec.end_text in recent:
            self._over = True
            return ()
        self._count += 1
        if self._count < self._spec.budget:
            return ()
        self._over = True
        return self._tokenize("\n" + self._spec.end_text + "\n\n")


class _Budget:
    """When generation must stop besides end-of-generation and stop strings."""

    def __init__(self, request: GenerationRequest, *, n_ctx: int) -> None:
        self.limit = request.max_new_tokens
        self._n_ctx = n_ctx
        self._time_limit_ms = request.time_limit_ms
        self._started = time.perf_counter()

    def exhausted(self, n_generated: int, kv_tokens: int, text: GeneratedText) -> StopCause | None:
        """The cause to stop after this token, or ``None`` to go on.

        The time limit counts from the first token and, as in llama-server, only
        stops once a new line was generated.
        """
        if self.limit is not None and n_generated >= self.limit:
            return StopCause.LIMIT
        if kv_tokens + 1 >= self._n_ctx:
            return StopCause.CONTEXT
        if n_generated == 1:
            self._started = time.perf_counter()
        elapsed_ms = (time.perf_counter() - self._started) * 1000.0
        if self._time_limit_ms and text.saw_new_line and elapsed_ms > self._time_limit_ms:
            return StopCause.TIME
        return None


def _token_piece(vocab: object, token: int) -> bytes:
    buffer = ctypes.create_string_buffer(64)
    size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)  # noqa: FBT003
    if size < 0:
        buffer = ctypes.create_string_buffer(-size)
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)  # noqa: FBT003
    return buffer.raw[:size]


def _meta(model: object, key: str) -> str:
    buffer = ctypes.create_string_buffer(256)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode(errors="replace") if size >= 0 else ""
