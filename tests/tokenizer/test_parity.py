"""The HF tokenizer built from GGUF metadata gives llama.cpp's ids exactly (MODELS.md fixtures)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bubo.config import default_model_path
from bubo.engine.vocab import LlamaVocabTokenizer
from bubo.model import read_metadata
from bubo.tokenizer import build_hf_tokenizer

from .._models import gemma3_path, qwen25_coder_path
from .corpus import corpus

pytestmark = pytest.mark.llama

MODELS: dict[str, Callable[[], Path]] = {
    "smollm2": default_model_path,
    "qwen2.5-coder": qwen25_coder_path,
    "gemma3": gemma3_path,
}


@pytest.fixture(name="pair", scope="module", params=list(MODELS))
def _pair(request: pytest.FixtureRequest):
    path = MODELS[request.param]()
    reference = LlamaVocabTokenizer(path)
    yield build_hf_tokenizer(read_metadata(path)), reference
    reference.close()


def test_zero_mismatches_on_the_corpus(pair) -> None:
    """Every string of a 3,000-string corpus tokenizes to llama.cpp's ids (parse_special on)."""
    ours, reference = pair
    mismatches = [text for text in corpus() if ours.encode(text) != reference.encode(text)]
    assert mismatches == []


def test_parse_special_off(pair) -> None:
    """With special-token parsing off, markup tokenizes as text, as in llama.cpp."""
    ours, reference = pair
    texts = [t for t in corpus(400) if "<" in t] + ["<|im_start|>", "<start_of_turn>", "<eos>"]
    for text in texts:
        assert ours.encode(text, parse_special=False) == reference.encode(text, parse_special=False), text


def test_add_special(pair) -> None:
    """BOS handling follows the GGUF's add_bos_token."""
    ours, reference = pair
    for text in ("Hello", ""):
        assert ours.encode(text, add_special=True) == reference.encode(text, add_special=True)
    assert ours.add_bos == reference.add_bos
    assert ours.bos_token == reference.bos_token
    assert ours.bos_id == reference.bos_id
    if ours.add_bos:
        assert ours.encode("Hello", add_special=True)[0] == ours.bos_id


def test_every_piece(pair) -> None:
    """Each token renders to the same bytes (llama_token_to_piece, special on)."""
    ours, reference = pair
    assert ours.n_vocab == reference.n_vocab
    assert [t for t in range(ours.n_vocab) if ours.token_bytes(t) != reference.token_bytes(t)] == []


@pytest.mark.parametrize("joiner", [" ", "\n", "", "。", "\n\n", "x\n", "!"])
def test_long_texts_cut_for_parallel_tokenizing_keep_their_ids(pair, joiner: str) -> None:
    """A long text tokenized in pieces (for speed and bounded memory) still gives llama.cpp's ids for it.

    The joiners make each kind of cut: before a space, after a new line, between
    a letter and a punctuation mark (ASCII and CJK).
    """
    ours, reference = pair
    texts = corpus()
    for start in range(0, 2800, 700):
        text = joiner.join(texts[start : start + 700])
        assert len(text) > 20_000
        assert ours.encode(text) == reference.encode(text)
        assert ours.encode(text, parse_special=False) == reference.encode(text, parse_special=False)


def test_huge_texts_are_cut_into_bounded_pieces(pair) -> None:
    """A text far longer than one piece, of each kind of cut, keeps llama.cpp's ids and count."""
    ours, reference = pair
    for text in (
        "The quick brown fox jumps over the lazy dog. " * 8000,
        "日本語の文章です。これは試験です、" * 12000,
        "line of text\nanother line\n" * 12000,
    ):
        expected = reference.encode(text)
        assert ours.encode(text) == expected
        assert ours.count(text) == len(expected)
        assert ours.count(text, add_special=True) == len(reference.encode(text, add_special=True))
        prefix = ours.encode(text, limit=1000)
        assert len(prefix) > 1000
        assert prefix == expected[: len(prefix)]


def test_a_token_never_stands_for_more_than_max_token_bytes(pair) -> None:
    """The size bound that refuses a prompt before tokenizing it holds on the corpus."""
    ours, _ = pair
    bound = ours.max_token_bytes
    assert bound is not None
    for text in corpus():
        assert len(ours.encode(text)) >= -(-len(text.encode()) // bound)
