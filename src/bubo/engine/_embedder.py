"""Embeddings: a second llama.cpp context over the loaded weights, with ``embeddings`` on.

The generation context and its decode thread are untouched: this context has
its own (small) KV cache and runs in whichever worker thread asks, one input
at a time (a lock), each input decoded in one batch and forgotten after.  Like
llama-server, an input must fit in one physical batch (``--ubatch-size``
tokens, and never more than the model's trained context): pooling needs every
token of a sequence in the same micro-batch.

Pooling is llama.cpp's (``--pooling``, default the model's own): ``none``
gives one vector per token, ``rank`` a reranker's scores (``n_cls_out`` of
them, where llama-cpp-python's ``Llama.embed`` would read ``n_embd``), the
others one vector per input.  How a reranker's (query, document) pair is
joined comes from the vocabulary and the GGUF's ``rerank`` template
(:class:`~bubo.engine.base.PairFormat`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import llama_cpp
import numpy as np
import numpy.typing as npt

from bubo.domain.modes import Pooling

from .base import EngineFailure, PairFormat

__all__ = ["POOLING_TYPES", "Embedder"]

POOLING_TYPES: Mapping[Pooling, int] = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}
_POOLING_NAMES: Mapping[int, Pooling] = {value: name for name, value in POOLING_TYPES.items()}


class Embedder:
    """Token ids to embedding vectors with a context of its own (thread-safe, one input at a time)."""

    def __init__(self, model: object, *, n_tokens: int, n_threads: int, pooling: Pooling | None) -> None:
        """Create the context over *model*, for inputs of up to *n_tokens* tokens.

        Raises:
            EngineFailure: llama.cpp could not create it.

        """
        self._lock = threading.Lock()
        # never past the trained context: an encoder's learned positions end there (BERT's 512), and a
        # position past them would read outside its table
        trained = llama_cpp.llama_model_n_ctx_train(model)
        n_tokens = min(n_tokens, trained) if trained > 0 else n_tokens
        params = llama_cpp.llama_context_default_params()
        params.embeddings = True
        params.n_ctx = params.n_batch = params.n_ubatch = n_tokens
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        if pooling is not None:
            params.pooling_type = POOLING_TYPES[pooling]
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise EngineFailure(f"llama.cpp could not create an embedding context of {n_tokens} tokens")
        try:
            self._memory = llama_cpp.llama_get_memory(ctx)
            self.n_tokens: int = llama_cpp.llama_n_ubatch(ctx)
            self.pooling: Pooling = _POOLING_NAMES.get(llama_cpp.llama_pooling_type(ctx), "none")
            self.n_embd: int = (
                llama_cpp.llama_model_n_cls_out(model)
                if self.pooling == "rank"
                else llama_cpp.llama_model_n_embd(model)
            )
            self.pair_format: PairFormat = pair_format(model)
        except BaseException:
            llama_cpp.llama_free(ctx)
            raise
        self._batch = llama_cpp.llama_batch_init(self.n_tokens, 0, 1)
        self._ctx: object | None = ctx

    def embed(self, tokens: Sequence[int], *, last_only: bool = False) -> npt.NDArray[np.float32]:
        """The embedding of *tokens*: shape ``(n_embd,)`` pooled, ``(len(tokens), n_embd)`` with ``none``.

        *last_only*, with ``none``: the last token's row alone, shape ``(n_embd,)``; llama.cpp
        computes no output for the others.

        Raises:
            EngineFailure: more tokens than one batch holds, none, or llama.cpp failed.

        """
        if not 0 < len(tokens) <= self.n_tokens:
            raise EngineFailure(
                f"an embedding input must have 1 to {self.n_tokens} tokens, not {len(tokens)}"
            )
        with self._lock:
            if self._ctx is None:
                raise EngineFailure("the engine is closed")
            batch = self._batch
            last_only = last_only and self.pooling == "none"
            last = len(tokens) - 1
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = not last_only or i == last
            batch.n_tokens = len(tokens)
            llama_cpp.llama_memory_clear(self._memory, True)  # noqa: FBT003
            status = llama_cpp.llama_decode(self._ctx, batch)
            try:
                if status != 0:
                    raise EngineFailure(f"llama_decode failed with status {status} on an embedding input")
                return self._read(len(tokens), last_only=last_only)
            finally:
                llama_cpp.llama_memory_clear(self._memory, True)  # noqa: FBT003

    def _read(self, n_tokens: int, *, last_only: bool) -> npt.NDArray[np.float32]:
        if last_only:
            row = llama_cpp.llama_get_embeddings_ith(self._ctx, n_tokens - 1)
            if not row:
                raise EngineFailure("llama.cpp gave no embedding for the last token")
            return np.ctypeslib.as_array(row, shape=(self.n_embd,)).copy()
        if self.pooling == "none":
            rows = [
                np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(self._ctx, i), shape=(self.n_embd,))
                for i in range(n_tokens)
            ]
            return np.array(rows, dtype=np.float32)
        pointer = llama_cpp.llama_get_embeddings_seq(self._ctx, 0)
        if not pointer:
            raise EngineFailure("llama.cpp gave no pooled embedding")
        return np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).copy()

    def close(self) -> None:
        """Free the context once the input under way is done; later inputs are refused (a second: nothing)."""
        with self._lock:
            if self._ctx is not None:
                llama_cpp.llama_batch_free(self._batch)
                llama_cpp.llama_free(self._ctx)
                self._ctx = None


def pair_format(model: object) -> PairFormat:
    """How *model* reads a (query, document) pair, from its vocabulary's flags and its ``rerank`` template."""
    template = llama_cpp.llama_model_chat_template(model, b"rerank")
    vocab = llama_cpp.llama_model_get_vocab(model)

    def added(flag: bool, token: int) -> int | None:
        return token if flag and token >= 0 else None

    eos = llama_cpp.llama_vocab_eos(vocab)
    return PairFormat(
        template=template.decode(errors="replace") if template else None,
        bos=added(llama_cpp.llama_vocab_get_add_bos(vocab), llama_cpp.llama_vocab_bos(vocab)),
        eos=added(
            llama_cpp.llama_vocab_get_add_eos(vocab), eos if eos >= 0 else llama_cpp.llama_vocab_sep(vocab)
        ),
        sep=added(llama_cpp.llama_vocab_get_add_sep(vocab), llama_cpp.llama_vocab_sep(vocab)),
    )
