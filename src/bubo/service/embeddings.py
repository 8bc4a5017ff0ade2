"""Embeddings of texts or token ids: tokenize, check, embed and normalize, off the event loop.

One vector per input is llama.cpp's pooled one (``--pooling mean``, ``cls``,
``last``, or an encoder's own), or, where the context pools nothing (``none``,
a generative model's own pooling), the input's last token's: what Ollama
answers for such a model (its runner reads ``llama_get_embeddings_ith`` of the
last token when ``llama_get_embeddings_seq`` has nothing), and the one state of
a causal model that has read the whole input.  llama-server's ``/embedding``
alone asks for one vector per token instead (``per_token``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

from bubo.engine import EmbeddingModel
from bubo.errors import InvalidRequest, NotImplementedOnThisModel

from .prompt import raw_tokens
from .runtime import Runtime
from .work import PREPARE_BYTES_PER_CHAR

__all__ = [
    "ANSWER_BYTES_PER_FLOAT",
    "MAX_EMBEDDING_FLOATS",
    "Embedded",
    "EmbeddingInput",
    "embed",
    "normalize",
    "require_embedder",
    "require_vectors",
    "too_long",
]

MAX_EMBEDDING_FLOATS = 4_194_304
"""Floats one embeddings request may return (16 MiB as float32): inputs x n_embd pooled, tokens x n_embd
with ``--pooling none``.  Each float costs ≈ 72 bytes while its JSON answer is built (Python floats,
lists, the text; measured: 4,194,304 floats peaked at 299 MB), so 2048 inputs of 512 tokens unpooled
(≈ 600 M floats) would have needed ≈ 40 GB."""

ANSWER_BYTES_PER_FLOAT = 72
"""Peak working memory of building a JSON answer, per float it holds (see :data:`MAX_EMBEDDING_FLOATS`)."""

EmbeddingInput = str | tuple[int | str, ...]
"""One input: a text (tokenized with the model's special tokens, as llama-server does), token ids, or
ids and texts mixed (the texts tokenized as a raw prompt's are, BOS added as for a prompt)."""


@attrs.frozen(kw_only=True)
class Embedded:
    """One input's embedding: a vector, or one per token (pooling ``none``, asked ``per_token``)."""

    vectors: npt.NDArray[np.float32]  # (n_embd,) one per input, (n_tokens, n_embd) per token
    n_tokens: int


def require_embedder(runtime: Runtime) -> EmbeddingModel:
    """The embedding model, or llama-server's 501 for a server started without ``--embeddings``."""
    embedder = runtime.engine.embedder
    if embedder is None:
        raise NotImplementedOnThisModel("this server does not serve embeddings; start it with --embeddings")
    return embedder


def require_vectors(runtime: Runtime) -> EmbeddingModel:
    """The embedding model, for one vector per text (Ollama's and OpenAI's): a reranker gives none.

    Raises:
        NotImplementedOnThisModel: the server was started without ``--embeddings``.
        InvalidRequest: the context ranks (``--pooling rank``: scores, not embeddings).

    """
    embedder = require_embedder(runtime)
    if embedder.pooling == "rank":
        raise InvalidRequest(
            "the server ranks (--pooling rank gives a reranker's scores, not embeddings); use /rerank",
            code="pooling_not_supported",
        )
    return embedder


async def embed(
    runtime: Runtime,
    inputs: Sequence[EmbeddingInput],
    *,
    param: str,
    truncate: bool = False,
    per_token: bool = False,
) -> list[Embedded]:
    """Embed every input, in order (each is one decode of the embedding context).

    One vector per input (the module's docstring says which), or with
    *per_token* and pooling ``none`` one per token, as llama.cpp gives them.

    *param* names the request field; an input's errors name ``<param>[<index>]``
    (``<param>`` alone for a single input).  With *truncate*, a text longer than
    one embedding may be keeps its first tokens (Ollama's ``truncate``) instead
    of being refused.

    Every input is tokenized and checked, and the answer's size bounded, before any is embedded.

    Raises:
        InvalidRequest: an empty input, a token id outside the vocabulary, an
            input longer than one batch (``--ubatch-size``), or an answer of
            more than :data:`MAX_EMBEDDING_FLOATS` floats.
        NotImplementedOnThisModel: the server was started without ``--embeddings``.

    """
    embedder = require_embedder(runtime)
    if not inputs:
        raise InvalidRequest("the input is empty", param=param)
    per_token = per_token and embedder.pooling == "none"
    if not per_token:
        _check_floats(len(inputs) * embedder.n_embd, f"{len(inputs)} inputs", embedder.n_embd, param=param)
    token_lists: list[tuple[int, ...]] = []
    n_tokens = 0
    for index, item in enumerate(inputs):
        where = param if len(inputs) == 1 else f"{param}[{index}]"
        chars = len(item) if isinstance(item, str) else 0
        tokens = await runtime.workers.run(
            functools.partial(_tokens, runtime, embedder, item, where, truncate=truncate),
            need_bytes=chars * PREPARE_BYTES_PER_CHAR,
        )
        n_tokens += len(tokens)
        if per_token:
            counted = f"{n_tokens} tokens" + (" so far" if index < len(inputs) - 1 else "")
            _check_floats(n_tokens * embedder.n_embd, counted, embedder.n_embd, param=param)
        token_lists.append(tokens)
    results = []
    async with runtime.engine.awake():  # the embedding context sleeps with the model
        last_only = embedder.pooling == "none" and not per_token  # the last token's row alone
        for tokens in token_lists:
            embed = functools.partial(embedder.embed, tokens, last_only=last_only)
            vectors = await runtime.workers.run(embed)
            results.append(Embedded(vectors=vectors, n_tokens=len(tokens)))
    return results


def _check_floats(n_floats: int, what: str, n_embd: int, *, param: str) -> None:
    if n_floats > MAX_EMBEDDING_FLOATS:
        raise InvalidRequest(
            f"the answer would hold {n_floats:,} floats ({what} x {n_embd} dimensions), more than "
            f"the {MAX_EMBEDDING_FLOATS:,} one request may return; send fewer or shorter inputs",
            code="embedding_too_large",
            param=param,
        )


def _tokens(
    runtime: Runtime, embedder: EmbeddingModel, item: EmbeddingInput, param: str, *, truncate: bool
) -> tuple[int, ...]:
    tokenizer = runtime.tokenizer
    if isinstance(item, str):
        if not item:
            raise InvalidRequest("an input must not be empty", param=param)
        tokens = tuple(tokenizer.encode(item, add_special=True, parse_special=False))
        if truncate:
            tokens = tokens[: embedder.n_tokens]
    elif any(isinstance(piece, str) for piece in item):
        tokens = tuple(
            raw_tokens(
                tokenizer,
                item,
                param=param,
                room=None if truncate else embedder.n_tokens,
                overflow=lambda n_tokens, _at_least: too_long(n_tokens, embedder.n_tokens, param),
            )
        )
        if truncate:
            tokens = tokens[: embedder.n_tokens]
    else:
        tokens = tuple(piece for piece in item if isinstance(piece, int))
        _check_length(tokens, embedder, param)
        for index, token in enumerate(tokens):
            if not 0 <= token < tokenizer.n_vocab:
                raise InvalidRequest(
                    f"token id {token} is outside the vocabulary (0..{tokenizer.n_vocab - 1})",
                    param=f"{param}[{index}]",
                )
    if not tokens:
        raise InvalidRequest("an input must not be empty", param=param)
    _check_length(tokens, embedder, param)
    return tokens


def _check_length(tokens: tuple[int | str, ...], embedder: EmbeddingModel, param: str) -> None:
    if len(tokens) > embedder.n_tokens:
        raise too_long(len(tokens), embedder.n_tokens, param)


def too_long(n_tokens: int, max_tokens: int, param: str) -> InvalidRequest:
    """The 400 for an input of *n_tokens* over the *max_tokens* of one embedding, in llama-server's words."""
    return InvalidRequest(
        f"the input ({n_tokens} tokens) is too large to embed: one embedding may have at most "
        f"{max_tokens} tokens; shorten it or start the server with a larger --ubatch-size",
        code="context_length_exceeded",
        param=param,
    )


EUCLIDEAN = 2
"""``embd_normalize`` 2: unit length, what ``/v1/embeddings`` always answers and ``/embedding`` by default."""


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
    else:  # the p-norm of the vector scaled by its largest component: no overflow for any p
        magnitudes = np.abs(vector, dtype=np.float64)
        largest = float(magnitudes.max(initial=0.0))
        norm = largest * float(np.sum((magnitudes / largest) ** mode) ** (1.0 / mode)) if largest else 0.0
    return (vector / norm).astype(np.float32) if norm > 0 else vector
