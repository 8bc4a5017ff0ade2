"""Embeddings of texts or token ids: tokenize, check, embed and normalize, off the event loop."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from bubo.engine import EmbeddingModel
from bubo.errors import InvalidRequest, NotImplementedOnThisModel

from .runtime import Runtime
from .work import PREPARE_BYTES_PER_CHAR

__all__ = ["Embedded", "EmbeddingInput", "embed", "normalize", "require_embedder"]

EmbeddingInput = str | tuple[int, ...]
"""One input: a text (tokenized with the model's special tokens, as llama-server does) or token ids."""


@attrs.frozen(kw_only=True)
class Embedded:
    """One input's embedding: a vector, or one per token (pooling ``none``)."""

    vectors: npt.NDArray[np.float32]  # (n_embd,) pooled, (n_tokens, n_embd) with pooling none
    n_tokens: int


def require_embedder(runtime: Runtime) -> EmbeddingModel:
    """The embedding model, or llama-server's 501 for a server started without ``--embeddings``."""
    embedder = runtime.engine.embedder
    if embedder is None:
        raise NotImplementedOnThisModel(
            "this server does not serve embeddings; start it with --embeddings (and --pooling mean "
            "for a generative model)"
        )
    return embedder


async def embed(runtime: Runtime, inputs: Sequence[EmbeddingInput], *, param: str) -> list[Embedded]:
    """Embed every input, in order (each is one decode of the embedding context).

    *param* names the request field; an input's errors name ``<param>[<index>]``
    (``<param>`` alone for a single input).

    Raises:
        InvalidRequest: an empty input, a token id outside the vocabulary, or an
            input longer than one batch (``--ubatch-size``).
        NotImplementedOnThisModel: the server was started without ``--embeddings``.

    """
    embedder = require_embedder(runtime)
    if not inputs:
        raise InvalidRequest("the input is empty", param=param)
    results = []
    for index, item in enumerate(inputs):
        where = param if len(inputs) == 1 else f"{param}[{index}]"
        chars = len(item) if isinstance(item, str) else 0
        tokens = await runtime.workers.run(
            functools.partial(_tokens, runtime, embedder, item, where),
            need_bytes=chars * PREPARE_BYTES_PER_CHAR,
        )
        vectors = await runtime.workers.run(functools.partial(embedder.embed, tokens))
        results.append(Embedded(vectors=vectors, n_tokens=len(tokens)))
    return results


def _tokens(runtime: Runtime, embedder: EmbeddingModel, item: EmbeddingInput, param: str) -> tuple[int, ...]:
    tokenizer = runtime.tokenizer
    if isinstance(item, str):
        if not item:
            raise InvalidRequest("an input must not be empty", param=param)
        tokens = tuple(tokenizer.encode(item, add_special=True, parse_special=False))
    else:
        tokens = item
        for index, token in enumerate(tokens):
            if not 0 <= token < tokenizer.n_vocab:
                raise InvalidRequest(
                    f"token id {token} is outside the vocabulary (0..{tokenizer.n_vocab - 1})",
                    param=f"{param}[{index}]",
                )
    if not tokens:
        raise InvalidRequest("an input must not be empty", param=param)
    if len(tokens) > embedder.n_tokens:
        raise InvalidRequest(
            f"the input has {len(tokens)} tokens, more than the {embedder.n_tokens} one embedding may "
            "have; shorten it or start the server with a larger --ubatch-size",
            code="context_length_exceeded",
            param=param,
        )
    return tokens


def normalize(vector: npt.NDArray[np.float32], mode: int) -> npt.NDArray[np.float32]:
    """*vector* normalized as llama.cpp's ``embd_normalize`` says.

    -1 none, 0 scaled to the int16 range by its largest component, 1 taxicab,
    2 Euclidean, p > 2 the p-norm.
    """
    if mode < 0:
        return vector
    if mode == 0:
        norm = float(np.abs(vector).max()) / 32760.0
    elif mode == 2:
        norm = float(np.sqrt(np.sum(np.square(vector, dtype=np.float64))))
    else:
        norm = float(np.sum(np.abs(vector, dtype=np.float64) ** mode) ** (1.0 / mode))
    return (vector / norm).astype(np.float32) if norm > 0 else vector
