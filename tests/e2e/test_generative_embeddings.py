"""Embeddings of a generative model through a real ``bubo serve --embeddings`` of SmolLM2, with real clients.

SmolLM2's own pooling is ``none``: llama.cpp gives a vector per token.  Ollama
answers such a model's ``/api/embed`` with its last token's vector, normalized;
so does Bubo, on ``/api/embed``, ``/api/embeddings`` and ``/v1/embeddings``
(llama-server's ``/embedding`` keeps its vector per token, unnormalized, and
its last row is the same vector).  Every capability ``/api/show``, ``/props``
and ``/v1/models`` list answers 200, and only those; a server without
``--embeddings`` lists no ``embedding`` and answers 501 saying how to start it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from .conftest import Server, openai_client, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

TEXTS = [
    "The cat sat on the mat.",
    "A cat was sitting on the rug.",
    "Quarterly revenue grew by four percent.",
]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
HI = [{"role": "user", "content": "hi"}]
OLLAMA_PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/api/generate", {"model": "bubo", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}),
    "tools": ("/api/chat", {"model": "bubo", "messages": HI, "tools": [TOOL], "stream": False,
                            "options": {"num_predict": 2}}),
    "insert": ("/api/generate", {"model": "bubo", "prompt": "a", "suffix": "b", "stream": False,
                                 "options": {"num_predict": 2}}),
    "embedding": ("/api/embed", {"model": "bubo", "input": TEXTS}),
    "thinking": ("/api/chat", {"model": "bubo", "messages": HI, "think": True, "stream": False,
                               "options": {"num_predict": 2}}),
}  # fmt: skip
LLAMA_PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/completion", {"prompt": "hi", "n_predict": 2}),
    "embedding": ("/v1/embeddings", {"model": "bubo", "input": TEXTS[0]}),
    "rerank": ("/rerank", {"query": "cat", "documents": ["a cat", "a car"]}),
}


def serve(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> contextlib.AbstractContextManager[Server]:
    return serving(tmp_path_factory.mktemp("generative-embeddings") / "bubo.log", *flags)


@pytest.fixture(name="embedding", scope="module")
def _embedding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model with ``--embeddings`` and no ``--pooling``: the model's own, ``none``."""
    with serve(tmp_path_factory, "--embeddings") as server:
        yield server


@pytest.fixture(name="plain", scope="module")
def _plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory) as server:
        yield server


def ollama_client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


def n_embd(api: ollama.Client) -> int:
    return int(api.show("bubo").modelinfo["llama.embedding_length"])


class TestPooledAsOllama:
    def test_ollama_embed_is_one_unit_vector_per_text_and_deterministic(self, embedding: Server) -> None:
        with ollama_client(embedding) as api:
            vectors = np.array(api.embed(model="bubo", input=TEXTS).embeddings)
            again = np.array(api.embed(model="bubo", input=TEXTS).embeddings)
            alone = np.array(api.embed(model="bubo", input=TEXTS[1]).embeddings)
            legacy = np.array(api.embeddings(model="bubo", prompt=TEXTS[0]).embedding)
            width = n_embd(api)
        assert vectors.shape == (len(TEXTS), width)
        assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0] * len(TEXTS), abs=1e-5)
        assert np.array_equal(vectors, again)  # the same text, the same vector
        assert np.array_equal(alone[0], vectors[1])  # each input is embedded alone, batch or not
        assert legacy == pytest.approx(vectors[0], abs=1e-6)  # /api/embeddings: the same, unit length too
        cosine = vectors @ vectors.T
        assert cosine[0, 1] > cosine[0, 2]  # a paraphrase is nearer than an unrelated sentence

    def test_openai_sdk_gets_the_same_vectors(self, embedding: Server, sdk: Any) -> None:
        client = sdk.enter_context(openai_client(embedding))
        floats = client.embeddings.create(model="bubo", input=TEXTS, encoding_format="float")
        packed = client.embeddings.create(model="bubo", input=TEXTS)  # base64, the SDK's default
        with ollama_client(embedding) as api:
            expected = np.array(api.embed(model="bubo", input=TEXTS).embeddings)
        assert [d.index for d in floats.data] == [0, 1, 2]
        assert np.array([d.embedding for d in floats.data]) == pytest.approx(expected, abs=1e-6)
        assert np.array([d.embedding for d in packed.data]) == pytest.approx(expected, abs=1e-6)
        assert floats.usage.prompt_tokens > len(TEXTS)
        raw = httpx.post(
            embedding.base_url + "/v1/embeddings",
            json={"model": "bubo", "input": TEXTS[0], "encoding_format": "base64"},
            timeout=60,
        ).json()
        decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
        assert decoded == pytest.approx(expected[0], abs=1e-6)

    def test_the_pooled_vector_is_the_last_tokens(self, embedding: Server) -> None:
        """llama-server's /embedding keeps pooling none's vector per token; its last row, normalized, is Ollama's."""
        rows = np.array(
            httpx.post(embedding.base_url + "/embedding", json={"content": TEXTS[0]}, timeout=60).json()[0][
                "embedding"
            ]
        )
        with ollama_client(embedding) as api:
            pooled = np.array(api.embed(model="bubo", input=TEXTS[0]).embeddings[0])
            width = n_embd(api)
        assert rows.shape[1] == width
        assert rows.shape[0] > 1  # a row per token
        assert rows[-1] / np.linalg.norm(rows[-1]) == pytest.approx(pooled, abs=1e-5)
        assert not np.allclose(np.linalg.norm(rows, axis=1), 1.0)  # per token: not normalized

    def test_generation_beside_embeddings_is_unchanged(self, embedding: Server) -> None:
        """Embeddings run on their own context in worker threads: a greedy answer is the same with them."""
        body = {"prompt": "Once upon a time", "n_predict": 48, "temperature": 0, "cache_prompt": False}
        url = embedding.base_url + "/completion"
        alone = httpx.post(url, json=body, timeout=120).json()["content"]

        def embed_many() -> int:
            with ollama_client(embedding) as api:
                return sum(len(api.embed(model="bubo", input=TEXTS).embeddings) for _ in range(8))

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            embedded = pool.submit(embed_many)
            beside = httpx.post(url, json=body, timeout=120).json()["content"]
            assert embedded.result(timeout=120) == 8 * len(TEXTS)
        assert beside == alone


def run_llm(server: Server, home: Path, *args: str) -> str:
    """Simon Willison's ``llm`` CLI with ``llm-ollama`` (both in the tests group), on *server*, offline."""
    env = {**os.environ, "LLM_USER_PATH": str(home), "OLLAMA_HOST": server.base_url}
    done = subprocess.run(
        [sys.executable, "-m", "llm", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class TestLlmOllama:
    """The program issue 39 tried: llm-ollama registers an embedding model from /api/show, then embeds."""

    def test_llm_embed_and_similar(self, embedding: Server, tmp_path: Path) -> None:
        assert "ollama/bubo" in run_llm(embedding, tmp_path, "embed-models")
        vector = json.loads(run_llm(embedding, tmp_path, "embed", "-m", "ollama/bubo", "-c", TEXTS[0]))
        with ollama_client(embedding) as api:
            expected = api.embed(model="bubo", input=TEXTS[0]).embeddings[0]
        assert vector == pytest.approx(expected, abs=1e-6)
        rows = tmp_path / "texts.csv"
        rows.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(TEXTS)))
        run_llm(embedding, tmp_path, "embed-multi", "sentences", str(rows), "-m", "ollama/bubo")
        similar = run_llm(embedding, tmp_path, "similar", "sentences", "-c", TEXTS[1])
        ranked = [json.loads(line)["id"] for line in similar.splitlines()]
        assert ranked[:2] == ["1", "0"]  # itself, then its paraphrase

    def test_llm_registers_no_embedding_model_where_none_is_served(
        self, plain: Server, tmp_path: Path
    ) -> None:
        assert "ollama/bubo" in run_llm(plain, tmp_path, "models")
        assert "ollama/bubo" not in run_llm(plain, tmp_path, "embed-models")


class TestCapabilitiesAreWhatIsServed:
    @pytest.mark.parametrize("which", ["embedding", "plain"])
    def test_each_listed_word_answers_200_and_no_other(
        self, which: str, request: pytest.FixtureRequest
    ) -> None:
        server: Server = request.getfixturevalue(which)
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            shown = http.post("/api/show", json={"model": "bubo"}).json()["capabilities"]
            props = http.get("/props").json()["capabilities"]
            listed = [m["capabilities"] for m in http.get("/v1/models").json()["models"]]
            ollama_answers = {w: http.post(p, json=b).status_code for w, (p, b) in OLLAMA_PROBES.items()}
            llama_answers = {w: http.post(p, json=b).status_code for w, (p, b) in LLAMA_PROBES.items()}
        assert {w for w, status in ollama_answers.items() if status == 200} == set(shown)
        assert {w for w, status in llama_answers.items() if status == 200} == set(props)
        assert all(words == props for words in listed)
        assert ("embedding" in shown) == (which == "embedding")

    def test_without_embeddings_a_clear_501_and_nothing_claimed(self, plain: Server, sdk: Any) -> None:
        with ollama_client(plain) as api:
            assert "embedding" not in api.show("bubo").capabilities
            with pytest.raises(ollama.ResponseError) as refused:
                api.embed(model="bubo", input=TEXTS[0])
        assert refused.value.status_code == 501
        assert "--embeddings" in refused.value.error
        client = sdk.enter_context(openai_client(plain))
        with pytest.raises(openai.APIStatusError) as also:
            client.embeddings.create(model="bubo", input=TEXTS[0])
        assert also.value.status_code == 501
        assert "--embeddings" in str(also.value)
