"""llama-server's ``POST /rerank`` (``/reranking``, ``/v1/rerank``, ``/v1/reranking``) on a reranker.

Two request shapes, as llama-server reads them.  Jina's (also Cohere's):
``query`` and ``documents`` (strings, or ``{"text": …}`` objects as those
clients may send them), answered ``{model, object, usage, results}`` with each
result's ``index`` and ``relevance_score``.  Hugging Face TEI's: ``query`` and
``texts``, answered with a bare array of ``{index, score}``.  Either way the
results are sorted by score, highest first, and cut to ``top_n`` (default: all);
``return_text`` adds each document's ``text``, and ``return_documents`` (Jina's,
Cohere's) its ``document: {text}``.  A server that does not rank answers 501
before it reads the body, as llama-server does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from quart import Response

from bubo.api._context import read_body, require_runtime
from bubo.api._json import json_response, unstructure
from bubo.errors import InvalidRequest
from bubo.service.rerank import MAX_RERANK_DOCUMENTS, Ranked, require_ranker, rerank

from .routes import blueprint

__all__ = ["RerankRequest"]


@attrs.frozen(kw_only=True)
class RerankDocument:
    """A document given as an object (Jina's and Cohere's clients): its text."""

    text: str


@attrs.frozen(kw_only=True)
class RerankRequest:
    """``query`` and its ``documents`` (Jina, Cohere) or ``texts`` (TEI)."""

    query: str | None = None
    documents: list[str | RerankDocument] | None = None
    texts: list[str | RerankDocument] | None = None
    top_n: int | None = None
    return_text: bool | None = None
    return_documents: bool | None = None
    model: str | None = None


@attrs.frozen(kw_only=True)
class RerankQuery:
    """A request read: the query, its documents' texts, and where they came from."""

    query: str
    documents: tuple[str, ...]
    param: str  # documents | texts
    top_n: int | None


@attrs.frozen(kw_only=True)
class DocumentText:
    """``document`` of a result (``return_documents``)."""

    text: str


@attrs.frozen(kw_only=True)
class RerankResult:
    """One document's place in a Jina-shaped answer."""

    index: int
    relevance_score: float
    text: str | None = None  # return_text
    document: DocumentText | None = None  # return_documents


@attrs.frozen(kw_only=True)
class TeiResult:
    """One document's place in a TEI-shaped answer."""

    index: int
    score: float
    text: str | None = None  # return_text


@attrs.frozen(kw_only=True)
class RerankUsage:
    """Tokens decoded: every pair's."""

    prompt_tokens: int
    total_tokens: int


@attrs.frozen(kw_only=True)
class RerankList:
    """The Jina-shaped answer."""

    model: str
    usage: RerankUsage
    results: list[RerankResult]
    object: str = "list"


def _precheck(data: dict[str, Any]) -> None:
    """Refuse a list of too many documents before millions of them are structured one by one."""
    for field in ("documents", "texts"):
        value = data.get(field)
        if isinstance(value, list) and len(value) > MAX_RERANK_DOCUMENTS:
            raise InvalidRequest(
                f"{field} holds {len(value)} documents; at most {MAX_RERANK_DOCUMENTS} are ranked in one "
                "request",
                param=field,
            )


def _texts(documents: Sequence[str | RerankDocument]) -> tuple[str, ...]:
    return tuple(item if isinstance(item, str) else item.text for item in documents)


@blueprint.post("/rerank")
@blueprint.post("/reranking")
@blueprint.post("/v1/rerank")
@blueprint.post("/v1/reranking")
async def rerank_documents() -> Response:
    """The documents by relevance to the query, highest first."""
    runtime = require_runtime()
    require_ranker(runtime)

    def translated(body: RerankRequest) -> RerankQuery:
        if body.model is not None:
            runtime.check_model(body.model)
        if body.query is None:
            raise InvalidRequest("query is required", code="missing_query", param="query")
        param = "texts" if body.texts is not None else "documents"
        documents = body.texts if body.texts is not None else body.documents
        if documents is None:
            raise InvalidRequest("documents is required: a non-empty array of texts", param="documents")
        if body.top_n is not None and body.top_n < 0:
            raise InvalidRequest("top_n must be 0 or more", param="top_n")
        return RerankQuery(query=body.query, documents=_texts(documents), param=param, top_n=body.top_n)

    body, asked = await read_body(runtime, RerankRequest, translated, precheck=_precheck)
    ranked = await rerank(runtime, asked.query, asked.documents, param=asked.param)
    best = sorted(ranked, key=lambda item: item.score, reverse=True)[: asked.top_n]
    if asked.param == "texts":
        return json_response(
            [
                unstructure(
                    TeiResult(
                        index=item.index,
                        score=item.score,
                        text=asked.documents[item.index] if body.return_text else None,
                    )
                )
                for item in best
            ]
        )
    n_tokens = sum(item.n_tokens for item in ranked)  # every pair was decoded, those cut by top_n too
    return json_response(
        _jina_answer(best, asked, body, model=body.model or runtime.model_id, n_tokens=n_tokens)
    )


def _jina_answer(
    best: Sequence[Ranked], asked: RerankQuery, body: RerankRequest, *, model: str, n_tokens: int
) -> RerankList:
    results = [
        RerankResult(
            index=item.index,
            relevance_score=item.score,
            text=asked.documents[item.index] if body.return_text else None,
            document=DocumentText(text=asked.documents[item.index]) if body.return_documents else None,
        )
        for item in best
    ]
    usage = RerankUsage(prompt_tokens=n_tokens, total_tokens=n_tokens)
    return RerankList(model=model, usage=usage, results=results)
