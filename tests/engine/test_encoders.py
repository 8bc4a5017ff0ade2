"""Encoders on the real engine: whether a model generates, its embedder, a reranker's pair format.

The reranker is built at test time with random weights (``tests/_tiny_gguf/reranker.py``):
its scores mean nothing; only their count and determinism are asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests._tiny_gguf.reranker import write_reranker

from bubo.engine import PairFormat
from bubo.engine.llama import LlamaEngine, load_llama_engine

from .._llama_options import engine_options

pytestmark = pytest.mark.llama


def load(path: Path, **options: object) -> LlamaEngine:
    return load_llama_engine(engine_options(model_path=path, n_ctx=512, n_threads=2, n_parallel=1, **options))


@pytest.fixture(name="ranker")
def _ranker(reranker_path: Path) -> Iterator[LlamaEngine]:
    engine = load(reranker_path)
    yield engine
    engine.close()


def test_a_decoder_generates(model_path: Path) -> None:
    """SmolLM2 generates, and serves no embeddings unless asked."""
    engine = load(model_path)
    try:
        assert engine.info.generates
        assert engine.embedder is None
    finally:
        engine.close()


def test_an_encoder_does_not_generate_and_embeds_unasked(ranker: LlamaEngine) -> None:
    """The BERT reranker cannot generate; its embedder opens without --embeddings, with the model's rank pooling."""
    assert not ranker.info.generates
    assert ranker.embedder is not None
    assert ranker.embedder.pooling == "rank"
    assert ranker.embedder.n_embd == 1  # one classifier label, not the 32 hidden values


def test_rank_scores(ranker: LlamaEngine) -> None:
    """A pair's score is one float, the same for the same pair, another for another pair."""
    embedder = ranker.embedder
    assert embedder is not None
    first, again, other = (
        embedder.embed(tokens) for tokens in ([2, 5, 6, 3, 7], [2, 5, 6, 3, 7], [2, 5, 9, 3, 7])
    )
    assert first.shape == (1,)
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()


def test_pair_format_from_the_vocabulary(ranker: LlamaEngine) -> None:
    """BERT's vocabulary: [CLS] as BOS, [SEP] between, no EOS; no rerank template."""
    assert ranker.embedder is not None
    assert ranker.embedder.pair_format == PairFormat(bos=2, sep=3)


def test_pair_format_from_the_rerank_template(tmp_path: Path) -> None:
    """tokenizer.chat_template.rerank is read as the GGUF holds it."""
    template = "[CLS]q: {query}[SEP]d: {document}[SEP]"
    engine = load(write_reranker(tmp_path / "templated.gguf", rerank_template=template))
    try:
        assert engine.embedder is not None
        assert engine.embedder.pair_format.template == template
    finally:
        engine.close()


def test_embedder_stops_at_the_trained_context(reranker_path: Path) -> None:
    """A batch larger than the training context (512 positions) is cut to it."""
    engine = load(reranker_path, n_ubatch=2048, n_batch=2048)
    try:
        assert engine.embedder is not None
        assert engine.embedder.n_tokens == 512
    finally:
        engine.close()
