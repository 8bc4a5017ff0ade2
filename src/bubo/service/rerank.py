"""Reranking: score each (query, document) pair with a reranker's classifier, off the event loop.

A reranker is a model served with rank pooling (``--reranking``, or a GGUF
whose pooling is rank): its embedding context gives a pair's scores
(``n_cls_out`` of them; the first is the relevance, as llama-server reads it).
Each pair is joined as llama.cpp's ``format_prompt_rerank`` joins it
(:class:`~bubo.engine.PairFormat`), decoded alone, and forgotten.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import attrs

from bubo.engine import EmbeddingModel, PairFormat
from bubo.errors import InvalidRequest, NotImplementedOnThisModel
from bubo.tokenizer import Tokenizer

from .embeddings import too_long
from .runtime import Runtime
from .work import PREPARE_BYTES_PER_CHAR

__all__ = ["MAX_RERANK_DOCUMENTS", "Ranked", "pair_tokens", "require_ranker", "rerank"]

MAX_RERANK_DOCUMENTS = 1000
_TEMPLATE_FIELDS = re.compile(r"(\{query\}|\{document\})")
"""Documents in one request (Cohere's bound): each is one decode of the query and the document, in turn,
so a longer list would hold the reranker for everyone else."""


@attrs.frozen(kw_only=True)
class Ranked:
    """One document's relevance to the query."""

    index: int  # the document's place in the request
    score: float
    n_tokens: int  # the pair's tokens, as decoded


def require_ranker(runtime: Runtime) -> EmbeddingModel:
    """The reranker, or llama-server's 501 for a server that does not rank.

    Raises:
        NotImplementedOnThisModel: no embedding context, or its pooling is not rank.

    """
    embedder = runtime.engine.embedder
    if embedder is None or embedder.pooling != "rank":
        raise NotImplementedOnThisModel(
            "this server does not rank documents; start it with --reranking and a reranker model"
        )
    return embedder


def pair_tokens(tokenizer: Tokenizer, pair: PairFormat, query: str, document: str) -> tuple[int, ...]:
    """The ids of one (query, document) pair, as llama.cpp's ``format_prompt_rerank`` builds them.

    With a rerank template (the GGUF's ``tokenizer.chat_template.rerank``) the
    query and the document go where ``{query}`` and ``{document}`` stand, in
    one pass (a query holding ``{document}`` keeps it as text), and the whole
    string is tokenized with special tokens parsed, as llama.cpp does, so the
    pair tokenizes as it does there: a special token typed in a query or a
    document is read as one (it reshapes only that pair's score).  Without a
    template, ``[BOS] query [EOS] [SEP] document [EOS]``, the texts never
    parsed for special tokens, so a document cannot close the query's half.
    """
    if pair.template is not None:
        fields = {"{query}": query, "{document}": document}
        # the operator's template (from the GGUF) is the pattern's subject; the request's text only fills it
        text = _TEMPLATE_FIELDS.sub(lambda field: fields[field.group(0)], pair.template)
        return tuple(tokenizer.encode(text, add_special=False, parse_special=True))
    ids = [] if pair.bos is None else [pair.bos]
    ids += tokenizer.encode(query, add_special=False, parse_special=False)
    ids += [] if pair.eos is None else [pair.eos]
    ids += [] if pair.sep is None else [pair.sep]
    ids += tokenizer.encode(document, add_special=False, parse_special=False)
    ids += [] if pair.eos is None else [pair.eos]
    return tuple(ids)


async def rerank(runtime: Runtime, query: str, documents: Sequence[str], *, param: str) -> list[Ranked]:
    """Score every document against *query*, in the documents' order.

    *param* names the documents' field (``documents`` or ``texts``); a pair's
    errors name ``<param>[<index>]``.  Every pair is tokenized and checked
    before any is scored.

    Raises:
        InvalidRequest: an empty query or document, no documents, more than
            :data:`MAX_RERANK_DOCUMENTS`, a query that leaves no room for a document,
            or a pair longer than one batch.
        NotImplementedOnThisModel: the server does not rank (:func:`require_ranker`).

    """
    ranker = require_ranker(runtime)
    if not query:
        raise InvalidRequest("query must not be empty", param="query")
    if not documents:
        raise InvalidRequest(f"{param} must be a non-empty array of documents", param=param)
    if len(documents) > MAX_RERANK_DOCUMENTS:
        raise InvalidRequest(
            f"{param} holds {len(documents)} documents; at most {MAX_RERANK_DOCUMENTS} are ranked in one "
            "request",
            param=param,
        )
    tokenizer = runtime.tokenizer
    query_ids = await runtime.workers.run(  # once, so that every pair below is bounded by one batch
        functools.partial(tokenizer.encode, query, add_special=False, parse_special=False),
        need_bytes=len(query) * PREPARE_BYTES_PER_CHAR,
    )
    if len(query_ids) >= ranker.n_tokens:  # no room left for a document
        raise too_long(len(query_ids), ranker.n_tokens, "query")
    pairs: list[tuple[int, ...]] = []
    for index, document in enumerate(documents):
        where = f"{param}[{index}]"
        pairs.append(
            await runtime.workers.run(
                functools.partial(_checked_pair, tokenizer, ranker, query, document, where),
                need_bytes=(len(query) + len(document)) * PREPARE_BYTES_PER_CHAR,
            )
        )
    ranked = []
    async with runtime.engine.awake():  # the reranker's context sleeps with the model
        for index, tokens in enumerate(pairs):
            scores = await runtime.workers.run(functools.partial(ranker.embed, tokens))
            ranked.append(Ranked(index=index, score=float(scores[0]), n_tokens=len(tokens)))
    return ranked


def _checked_pair(
    tokenizer: Tokenizer, ranker: EmbeddingModel, query: str, document: str, param: str
) -> tuple[int, ...]:
    if not document:
        raise InvalidRequest("a document must not be empty", param=param)
    tokens = pair_tokens(tokenizer, ranker.pair_format, query, document)
    if len(tokens) > ranker.n_tokens:
        raise too_long(len(tokens), ranker.n_tokens, param)
    return tokens
