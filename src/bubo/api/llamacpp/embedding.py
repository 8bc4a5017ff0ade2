"""llama-server's ``POST /embedding`` (and ``/embeddings``): every pooling, ``embd_normalize``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
from quart import Response

from bubo.api._context import read_body, require_runtime
from bubo.api._embedding_inputs import embedding_inputs
from bubo.api._json import dumps
from bubo.errors import InvalidRequest
from bubo.service.embeddings import (
    ANSWER_BYTES_PER_FLOAT,
    EUCLIDEAN,
    Embedded,
    EmbeddingInput,
    embed,
    normalize,
    require_embedder,
)

from .routes import blueprint

__all__ = ["EmbeddingRequest"]


@attrs.frozen(kw_only=True)
class EmbeddingRequest:
    """``content`` (or ``input``): a string, token ids, or a list of either."""

    content: Any = None
    input: Any = None
    model: str | None = None
    embd_normalize: int | None = None  # -1 none, 0 max-absolute (int16), 1 taxicab, 2 Euclidean, >2 p-norm


@attrs.frozen(kw_only=True)
class EmbeddingResult:
    """One input's vectors: one when pooled, one per token with ``--pooling none`` (not normalized)."""

    index: int
    embedding: list[list[float]]


@blueprint.post("/embedding")
@blueprint.post("/embeddings")
async def embedding() -> Response:
    """A list of ``{index, embedding}``, one per input."""
    runtime = require_runtime()
    embedder = require_embedder(runtime)

    def translated(body: EmbeddingRequest) -> tuple[list[EmbeddingInput], str]:
        if body.model is not None:
            runtime.check_model(body.model)
        value, param = (body.input, "input") if body.input is not None else (body.content, "content")
        if value is None:
            raise InvalidRequest("content (or input) is required", code="missing_input", param="content")
        return embedding_inputs(value, param, max_tokens=embedder.n_tokens), param

    body, (inputs, param) = await read_body(runtime, EmbeddingRequest, translated)
    results = await embed(runtime, inputs, param=param, per_token=True)
    mode = EUCLIDEAN if body.embd_normalize is None else body.embd_normalize
    n_floats = sum(result.vectors.size for result in results)
    # Up to MAX_EMBEDDING_FLOATS Python floats and their JSON: seconds of work, off the event loop.
    text = await runtime.workers.run(
        functools.partial(_answer, results, pooled=embedder.pooling != "none", mode=mode),
        need_bytes=n_floats * ANSWER_BYTES_PER_FLOAT,
    )
    return Response(text, content_type="application/json")


def _answer(results: Sequence[Embedded], *, pooled: bool, mode: int) -> str:
    answer = []
    for index, result in enumerate(results):
        rows = [normalize(result.vectors, mode).tolist()] if pooled else result.vectors.tolist()
        answer.append(EmbeddingResult(index=index, embedding=rows))
    return dumps([attrs.asdict(item) for item in answer])
