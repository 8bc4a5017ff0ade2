"""One llama.cpp context: decode tokens into sequence 0, read logits, tokenize.

Only the engine thread that holds the slot calls into it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np
import numpy.typing as npt

from ._kv import SequenceCache, SnapshotStore
from .base import EngineCounters, EngineFailure

__all__ = ["FATAL_DECODE_STATUS", "LlamaContext"]

# llama_decode: 0 ok, 1 no KV slot, 2 aborted, -1 invalid batch, -2 and below compute failures.
FATAL_DECODE_STATUS = -2


class LlamaContext:
    """A context with one sequence, its cache of tokens, and the counters it feeds."""

    def __init__(
        self,
        model: object,
        params: llama_cpp.llama_context_params,
        *,
        counters: EngineCounters,
        snapshots: SnapshotStore | None,
        batch_capacity: int,
    ) -> None:
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise EngineFailure(f"llama.cpp could not create a context of {params.n_ctx} tokens")
        self.ctx = ctx
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_ctx: int = llama_cpp.llama_n_ctx(ctx)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.cache = SequenceCache(ctx, llama_cpp.llama_get_memory(ctx), snapshots)
        self._counters = counters
        self._batch_capacity = batch_capacity
        self._batch = llama_cpp.llama_batch_init(batch_capacity, 0, 1)

    def decode(self, tokens: Sequence[int]) -> None:
        """Evaluate *tokens* after the cached ones; logits for the last one only."""
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        self._check(llama_cpp.llama_decode(self.ctx, llama_cpp.llama_batch_get_one(array, len(tokens))))
        self._appended(tokens)

    def decode_all(self, tokens: Sequence[int]) -> None:
        """Evaluate *tokens* with logits at every position (to verify a draft)."""
        if len(tokens) > self._batch_capacity:
            raise EngineFailure(f"a batch of {len(tokens)} tokens exceeds {self._batch_capacity}")
        batch = self._batch
        start = len(self.cache.tokens)
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = len(tokens)
        self._check(llama_cpp.llama_decode(self.ctx, batch))
        self._appended(tokens)

    def _appended(self, tokens: Sequence[int]) -> None:
        self.cache.extend(tokens)
        counters = self._counters
        counters.n_decode += 1
        counters.kv_tokens = len(self.cache.tokens)
        counters.n_tokens_max = max(counters.n_tokens_max, counters.kv_tokens)

    def _check(self, status: int) -> None:
        """Raise for a failed ``llama_decode``.

        1 (no room in the KV cache) and -1 (a bad batch) leave the context usable;
        lower values are compute failures (a lost device) and are fatal.
        """
        if status != 0:
            if status <= FATAL_DECODE_STATUS:
                raise EngineFailure(f"llama_decode failed with status {status}", fatal=True)
            self.forget()  # the failed batch may have left part of itself in the cache
            raise EngineFailure(f"llama_decode failed with status {status}")

    def forget(self) -> None:
        """Drop the whole cached sequence (after a failure that may have left it half-written)."""
        self.cache.clear()
        self._counters.kv_tokens = 0

    def truncate(self, keep: int) -> None:
        """Keep only the first *keep* cached tokens (rejected draft tokens go)."""
        self.cache.truncate(keep)
        self._counters.kv_tokens = len(self.cache.tokens)

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        """The logits at batch position *index* of the last decode (-1: the last)."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def tokenize(self, text: str) -> tuple[int, ...]:
        """llama.cpp's own tokens for *text* (special markup parsed)."""
        data = text.encode()
        out = (llama_cpp.llama_token * (len(data) + 4))()
        count = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, len(out), False, True)  # noqa: FBT003
        return tuple(out[: max(count, 0)])

    def close(self) -> None:
        """Free the batch and the context."""
        if self.ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None


def token_piece(vocab: object, token: int) -> bytes:
    """The bytes llama.cpp renders for *token* (``special=false``: control tokens are empty)."""
    buffer = ctypes.create_string_buffer(64)
    size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)  # noqa: FBT003
    if size < 0:
        buffer = ctypes.create_string_buffer(-size)
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)  # noqa: FBT003
    return buffer.raw[:size]
