"""/v1/embeddings and /embedding over the fake engine's embedder: shapes, pooling, normalization, errors."""

from __future__ import annotations

import base64
import importlib
import threading

import attrs
import numpy as np
import pytest
from tests.conftest import wait_until_ready

from bubo.engine.fake import FakeEmbedder, FakeEngine
from bubo.server import create_app
from bubo.service.embeddings import MAX_EMBEDDING_FLOATS


async def _app_with(settings, make_runtime, script, embedder):
    runtime = attrs.evolve(make_runtime(), engine=FakeEngine(script=script, embedder=embedder))
    return create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)


@pytest.fixture(name="embedder")
def _embedder(request) -> FakeEmbedder:
    return FakeEmbedder(pooling=getattr(request, "param", "mean"), n_tokens=16)


@pytest.fixture(name="emb_app")
async def _emb_app(settings, make_runtime, script, embedder):
    app = await _app_with(settings, make_runtime, script, embedder)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


class TestOpenAI:
    async def test_list_input(self, emb_app, embedder, tokenizer) -> None:
        """One unit-length vector per input, in order, and usage counts the tokens."""
        response = await emb_app.test_client().post(
            "/v1/embeddings", json={"model": "bubo", "input": ["hello world", "good night"]}
        )
        assert response.status_code == 200
        body = await response.get_json()
        assert body["object"] == "list"
        assert body["model"] == "bubo"
        assert [item["index"] for item in body["data"]] == [0, 1]
        assert {item["object"] for item in body["data"]} == {"embedding"}
        first = np.array(body["data"][0]["embedding"])
        assert first.shape == (embedder.n_embd,)
        assert np.linalg.norm(first) == pytest.approx(1.0, abs=1e-5)
        n_tokens = sum(len(tokenizer.encode(t, add_special=True)) for t in ("hello world", "good night"))
        assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        expected = embedder.embed(tokenizer.encode("hello world", add_special=True))
        assert first == pytest.approx(expected / np.linalg.norm(expected), abs=1e-5)

    async def test_base64(self, emb_app) -> None:
        """encoding_format base64: the same vector as little-endian float32."""
        client = emb_app.test_client()
        floats = await (await client.post("/v1/embeddings", json={"input": "hi"})).get_json()
        packed = await (
            await client.post("/v1/embeddings", json={"input": "hi", "encoding_format": "base64"})
        ).get_json()
        decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
        assert decoded == pytest.approx(floats["data"][0]["embedding"], abs=1e-6)

    @pytest.mark.parametrize("value", [[5, 6, 7], [[5, 6, 7], [8, 9]]])
    async def test_token_ids(self, emb_app, embedder, value) -> None:
        """Token ids are embedded as given (no special tokens added)."""
        response = await emb_app.test_client().post("/v1/embeddings", json={"input": value})
        assert response.status_code == 200
        expected = [tuple(v) for v in value] if isinstance(value[0], list) else [tuple(value)]
        assert embedder.inputs == expected

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({}, "input"),
            ({"input": ""}, "input"),
            ({"input": []}, "input"),
            ({"input": ["a", ""]}, "input[1]"),
            ({"input": ["a", 3.5]}, "input[1]"),
            ({"input": [1, 999999]}, "input[1]"),
            ({"input": "word " * 40}, "input"),
            ({"input": ["a"] * 2049}, "input"),
            ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
            ({"input": "a", "dimensions": 3}, "dimensions"),
        ],
    )
    async def test_bad_input(self, emb_app, body, param) -> None:
        """Each bad field is a 400 naming it; an input over --ubatch-size tokens, or over 2048 inputs, too."""
        response = await emb_app.test_client().post("/v1/embeddings", json=body)
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param

    @pytest.mark.parametrize("embedder", ["none"], indirect=True)
    async def test_unpooled_is_the_last_tokens_vector(self, emb_app, embedder, tokenizer) -> None:
        """Pooling none (a generative model's own): each input's last token's vector, normalized, as Ollama.

        llama-server answers this case 400; Bubo answers what Ollama's ``/v1/embeddings`` does.
        """
        response = await emb_app.test_client().post(
            "/v1/embeddings", json={"input": ["one two three", "four"]}
        )
        assert response.status_code == 200
        data = (await response.get_json())["data"]
        for item, text in zip(data, ("one two three", "four"), strict=True):
            rows = embedder.embed(tokenizer.encode(text, add_special=True))
            assert rows.ndim == 2  # one row per token, as llama.cpp gives them with pooling none
            assert item["embedding"] == pytest.approx(rows[-1] / np.linalg.norm(rows[-1]), abs=1e-5)

    @pytest.mark.parametrize("embedder", ["rank"], indirect=True)
    async def test_a_reranker_is_refused(self, emb_app) -> None:
        """Rank pooling gives scores, not embeddings: 400 pointing to /rerank."""
        response = await emb_app.test_client().post("/v1/embeddings", json={"input": "a"})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], "/rerank" in error["message"]) == ("pooling_not_supported", True)

    async def test_without_the_flag(self, app) -> None:
        """Without --embeddings: 501, and the message says how to turn them on."""
        for path in ("/v1/embeddings", "/embedding", "/embeddings"):
            response = await app.test_client().post(path, json={"input": "a"})
            assert response.status_code == 501
            assert "--embeddings" in (await response.get_json())["error"]["message"]


class TestLlamaServer:
    async def test_pooled(self, emb_app, embedder, tokenizer) -> None:
        """/embedding: [{index, embedding: [vector]}], Euclidean-normalized by default."""
        response = await emb_app.test_client().post("/embedding", json={"content": "hello"})
        body = await response.get_json()
        assert [item["index"] for item in body] == [0]
        (vector,) = body[0]["embedding"]
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)

    @pytest.mark.parametrize(("mode", "norm"), [(-1, None), (1, 1), (2, 2), (3, 3)])
    async def test_embd_normalize(self, emb_app, embedder, tokenizer, mode, norm) -> None:
        """embd_normalize picks llama.cpp's norm; -1 leaves the vector as the model gave it."""
        response = await emb_app.test_client().post(
            "/embedding", json={"content": "hello", "embd_normalize": mode}
        )
        (vector,) = (await response.get_json())[0]["embedding"]
        raw = embedder.embed(tokenizer.encode("hello", add_special=True))
        expected = raw if norm is None else raw / np.linalg.norm(raw, ord=norm)
        assert vector == pytest.approx(expected, abs=1e-5)

    @pytest.mark.parametrize("mode", [1000, 2**62])
    async def test_a_large_p_norm_does_not_overflow(self, emb_app, mode) -> None:
        """A p-norm for a large p tends to the largest component: the vector's largest is then about 1,
        not 0 (|x|**p overflowing to infinity would divide every component away)."""
        response = await emb_app.test_client().post(
            "/embedding", json={"content": "hello", "embd_normalize": mode}
        )
        (vector,) = (await response.get_json())[0]["embedding"]
        assert float(np.abs(vector).max()) == pytest.approx(1.0, rel=0.01)

    @pytest.mark.parametrize("embedder", ["none"], indirect=True)
    async def test_unpooled(self, emb_app, tokenizer) -> None:
        """--pooling none: one unnormalized vector per token."""
        response = await emb_app.test_client().post("/embeddings", json={"input": ["one two three"]})
        (item,) = await response.get_json()
        assert len(item["embedding"]) == len(tokenizer.encode("one two three", add_special=True))

    async def test_missing_content(self, emb_app) -> None:
        response = await emb_app.test_client().post("/embedding", json={})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "content"


class TestAnswerSize:
    """An answer is bounded before anything is embedded, and built off the event loop."""

    @staticmethod
    async def _post(settings, make_runtime, script, embedder, path, body):
        app = await _app_with(settings, make_runtime, script, embedder)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            response = await test_app.test_client().post(path, json=body)
            return response.status_code, await response.get_json()

    @pytest.mark.parametrize(("path", "param"), [("/v1/embeddings", "input"), ("/embedding", "content")])
    async def test_pooled_over_the_limit(self, settings, make_runtime, script, path, param) -> None:
        """Inputs x n_embd over MAX_EMBEDDING_FLOATS: 400 naming the inputs, saying how many and the limit."""
        embedder = FakeEmbedder(n_tokens=16, n_embd=MAX_EMBEDDING_FLOATS // 2 + 1)
        status, body = await self._post(
            settings, make_runtime, script, embedder, path, {param: ["one", "two"]}
        )
        assert status == 400
        assert body["error"]["param"] == param
        assert body["error"]["code"] == "embedding_too_large"
        assert f"{2 * embedder.n_embd:,} floats" in body["error"]["message"]
        assert f"{MAX_EMBEDDING_FLOATS:,}" in body["error"]["message"]
        assert embedder.inputs == []

    async def test_unpooled_but_one_vector_per_input_counts_inputs(
        self, settings, make_runtime, script
    ) -> None:
        """Pooling none where one vector per input is answered (the last token's): inputs x n_embd bound it."""
        embedder = FakeEmbedder(pooling="none", n_tokens=16, n_embd=300_000)
        status, body = await self._post(
            settings, make_runtime, script, embedder, "/v1/embeddings", {"input": [[5] * 8, [6] * 8]}
        )
        assert status == 200
        assert [len(item["embedding"]) for item in body["data"]] == [embedder.n_embd] * 2

    async def test_unpooled_counts_every_token(self, settings, make_runtime, script) -> None:
        """--pooling none: the tokens of all inputs x n_embd are bounded, though each input alone fits."""
        embedder = FakeEmbedder(pooling="none", n_tokens=16, n_embd=300_000)
        assert 8 * embedder.n_embd <= MAX_EMBEDDING_FLOATS < 16 * embedder.n_embd
        status, body = await self._post(
            settings, make_runtime, script, embedder, "/embedding", {"content": [[5] * 8, [6] * 8]}
        )
        assert status == 400
        assert body["error"]["param"] == "content"
        assert body["error"]["code"] == "embedding_too_large"
        assert f"{16 * embedder.n_embd:,} floats" in body["error"]["message"]
        assert embedder.inputs == []

    @pytest.mark.parametrize(
        ("value", "param"), [([999999] * 17, "input"), ([[1], [999999] * 17], "input[1]")]
    )
    async def test_length_is_checked_before_the_ids(self, emb_app, value, param) -> None:
        """A list of ids longer than one batch is refused for its length, before its ids are read."""
        response = await emb_app.test_client().post("/v1/embeddings", json={"input": value})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", param)
        assert "(17 tokens) is too large" in error["message"]  # llama-server's words, which its suite checks

    @pytest.mark.parametrize("path", ["/v1/embeddings", "/embedding"])
    async def test_a_text_over_one_batch_is_too_large(self, emb_app, path) -> None:
        body = {"input": "word " * 200} if path == "/v1/embeddings" else {"content": "word " * 200}
        response = await emb_app.test_client().post(path, json=body)
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert error["code"] == "context_length_exceeded"
        assert "tokens) is too large to embed" in error["message"]

    @pytest.mark.parametrize(
        ("module", "path"),
        [("bubo.api.openai.embeddings", "/v1/embeddings"), ("bubo.api.llamacpp.embedding", "/embedding")],
    )
    async def test_answer_is_built_in_a_worker(self, emb_app, monkeypatch, module, path) -> None:
        """The floats' JSON is written in a worker thread, never on the event loop's."""
        threads = []
        real = importlib.import_module(module).dumps

        def recording_dumps(value):
            threads.append(threading.current_thread().name)
            return real(value)

        monkeypatch.setattr(f"{module}.dumps", recording_dumps)
        response = await emb_app.test_client().post(path, json={"input": ["a", "b"]})
        assert response.status_code == 200
        assert threads == ["bubo-work"]
