"""OpenAI's ``POST /v1/embeddings`` (``--embeddings``): one float or base64 vector per input.

Pooled by llama.cpp, or for a model whose pooling is ``none`` (a generative
one's own) the input's last token's, as Ollama's ``/v1/embeddings`` answers
there (``service/embeddings.py``); llama-server refuses that case with a 400.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Sequence
from typing import Any, Literal

import attrs
from quart import Response

from bubo.api._context import read_body, require_runtime
from bubo.api._embedding_inputs import embedding_inputs
from bubo.api._json import dumps, unstructure
from bubo.errors import InvalidRequest
from bubo.service.embeddings import (
    ANSWER_BYTES_PER_FLOAT,
    EUCLIDEAN,
    Embedded,
    EmbeddingInput,
    embed,
    normalize,
    require_vectors,
)

from .routes import blueprint

__all__ = ["EmbeddingRequest"]


@attrs.frozen(kw_only=True)
class EmbeddingRequest:
    """``POST /v1/embeddings``; ``input`` is checked by :func:`embedding_inputs`."""

    input: Any = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


@attrs.frozen(kw_only=True)
class EmbeddingData:
    """One input's vector."""

    embedding: list[float] | str
    index: int
    object: str = "embedding"


@attrs.frozen(kw_only=True)
class EmbeddingUsage:
    """Tokens embedded."""

    prompt_tokens: int
    total_tokens: int


@attrs.frozen(kw_only=True)
class EmbeddingList:
    """The ``/v1/embeddings`` response."""

    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


@blueprint.post("/v1/embeddings")
async def embeddings() -> Response:
    """One Euclidean-normalized vector per input (see the module's docstring)."""
    runtime = require_runtime()
    embedder = require_vectors(runtime)

    def translated(body: EmbeddingRequest) -> list[EmbeddingInput]:
        if body.model is not None:
            runtime.check_model(body.model)
        if body.input is None:
            raise InvalidRequest("input is required", code="missing_input", param="input")
        return embedding_inputs(body.input, "input", max_tokens=embedder.n_tokens)

    body, inputs = await read_body(runtime, EmbeddingRequest, translated)
    if body.dimensions is not None and body.dimensions != embedder.n_embd:
        raise InvalidRequest(
            f"this model's embeddings have {embedder.n_embd} dimensions; they cannot be shortened",
            param="dimensions",
        )
    results = await embed(runtime, inputs, param="input")
    # Up to MAX_EMBEDDING_FLOATS Python floats and their JSON: seconds of work, off the event loop.
    text = await runtime.workers.run(
        functools.partial(
            _answer, results, model=body.model or runtime.model_id, as_base64=body.encoding_format == "base64"
        ),
        need_bytes=sum(result.vectors.size for result in results) * ANSWER_BYTES_PER_FLOAT,
    )
    return Response(text, content_type="application/json")


def _answer(results: Sequence[Embedded], *, model: str, as_base64: bool) -> str:
    data = []
    for index, result in enumerate(results):
        vector = normalize(result.vectors, EUCLIDEAN)
        encoded: list[float] | str = (
            # little-endian float32, as OpenAI's SDK decodes it
            base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii") if as_base64 else vector.tolist()
        )
        data.append(EmbeddingData(embedding=encoded, index=index))
    n_tokens = sum(result.n_tokens for result in results)
    usage = EmbeddingUsage(prompt_tokens=n_tokens, total_tokens=n_tokens)
    return dumps(unstructure(EmbeddingList(data=data, model=model, usage=usage)))
