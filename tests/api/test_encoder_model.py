"""A model that cannot generate (an encoder, BERT's kind): generation answers 501, listings say what it does.

The fake engine stands for it with ``generates=False`` in its model facts, and an
embedder (the real engine serves an encoder's embeddings without ``--embeddings``).
"""

from __future__ import annotations

import attrs
import pytest
from tests.conftest import wait_until_ready

from bubo.engine.fake import FakeEmbedder, FakeEngine, fake_model_info
from bubo.server import create_app

GENERATING = [
    ("/v1/chat/completions", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "bubo", "prompt": "hi"}),
    ("/completion", {"prompt": "hi"}),
    ("/v1/messages", {"model": "bubo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "bubo", "input": "hi"}),
    ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": "bubo", "prompt": "hi"}),
]


@pytest.fixture(name="embedder")
def _embedder(request) -> FakeEmbedder:
    return FakeEmbedder(pooling=getattr(request, "param", "mean"), n_tokens=16)


@pytest.fixture(name="encoder")
def _encoder(script, embedder) -> FakeEngine:
    return FakeEngine(
        attrs.evolve(fake_model_info(), architecture="bert", generates=False), script, embedder=embedder
    )


@pytest.fixture(name="encoder_app")
async def _encoder_app(settings, make_runtime, encoder):
    runtime = attrs.evolve(make_runtime(), engine=encoder)
    app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


@pytest.mark.parametrize(("path", "body"), GENERATING)
async def test_generation_answers_501(encoder_app, encoder, path, body) -> None:
    """Every generating route answers 501 not_implemented, naming what the model serves; nothing decodes."""
    response = await encoder_app.test_client().post(path, json=body)
    assert response.status_code == 501
    error = (await response.get_json())["error"]
    if path.startswith("/api/"):  # Ollama's envelope: the message alone
        message = error
    else:
        assert error.get("code", error.get("type")) in {"not_implemented", "not_implemented_error"}
        message = error["message"]
    assert "does not generate text" in message
    assert "/v1/embeddings" in message
    assert encoder.requests == []


async def test_embeddings_still_served(encoder_app) -> None:
    """The encoder's own use works beside the refusals."""
    response = await encoder_app.test_client().post("/v1/embeddings", json={"input": "hi"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("embedder", "word", "ollama"),
    [("mean", "embedding", ["embedding"]), ("rank", "rerank", [])],
    indirect=["embedder"],
)
async def test_listings_say_what_it_serves(encoder_app, word, ollama) -> None:
    """/v1/models and /props list the encoder's use, not completion; Ollama lists embedding, and no word for rank."""
    client = encoder_app.test_client()
    models = await (await client.get("/v1/models")).get_json()
    assert {tuple(item["capabilities"]) for item in models["models"]} == {(word,)}
    props = await (await client.get("/props")).get_json()
    assert props["capabilities"] == [word]
    show = await (await client.post("/api/show", json={"model": "bubo"})).get_json()
    assert show["capabilities"] == ollama


@pytest.mark.parametrize("embedder", ["rank"], indirect=True)
@pytest.mark.parametrize(("path", "body"), [("/v1/embeddings", {"input": "hi"}), ("/api/embed", {"model": "bubo", "input": "hi"})])  # fmt: skip
async def test_a_reranker_gives_no_embeddings(encoder_app, embedder, path, body) -> None:
    """A reranker's scores are not embeddings: /v1/embeddings and /api/embed answer 400, pointing to /rerank."""
    response = await encoder_app.test_client().post(path, json=body)
    assert response.status_code == 400
    assert "/rerank" in str(await response.get_json())
    assert embedder.inputs == []


async def test_a_generating_model_lists_completion(app) -> None:
    """A decoder is listed for completion, as before."""
    client = app.test_client()
    assert (await (await client.get("/props")).get_json())["capabilities"] == ["completion"]
    models = await (await client.get("/v1/models")).get_json()
    assert {tuple(item["capabilities"]) for item in models["models"]} == {("completion",)}
