"""Every dialect's capability list comes from one place and claims only what the server answers.

Over the fake engine in each setup (text only, ``--embeddings`` with the
model's own pooling ``none`` or ``mean``, a reranker, an encoder, a projector,
fill-in-the-middle tokens): Ollama's ``/api/show``, llama-server's
``/v1/models`` ``models`` and ``/props`` list the same things, and each probe
request answers 200 exactly where its word is listed.  The same through a real
server and the real clients: ``tests/e2e/test_generative_embeddings.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from tests.conftest import QWEN3_STYLE, wait_until_ready

from bubo.engine import FimTokens
from bubo.engine.fake import FakeEmbedder, FakeEngine, FakeVision, fake_model_info
from bubo.server import create_app
from bubo.templates import ChatTemplate

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
OLLAMA_PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/api/generate", {"model": "bubo", "prompt": "hi", "stream": False}),
    "tools": ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
                            "stream": False}),
    "insert": ("/api/generate", {"model": "bubo", "prompt": "a", "suffix": "b", "stream": False}),
    "embedding": ("/api/embed", {"model": "bubo", "input": ["cat", "dog"]}),
    "thinking": ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}], "think": True,
                               "stream": False}),
}  # fmt: skip
LLAMA_PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/completion", {"prompt": "hi", "n_predict": 2}),
    "embedding": ("/v1/embeddings", {"input": "cat"}),
    "rerank": ("/rerank", {"query": "cat", "documents": ["a cat", "a car"]}),
}
SETUPS = {
    "text only": {},
    "embeddings, pooling none": {"embedder": FakeEmbedder(pooling="none", n_tokens=16)},
    "embeddings, pooling mean": {"embedder": FakeEmbedder(pooling="mean", n_tokens=16)},
    "reranker": {"embedder": FakeEmbedder(pooling="rank", n_tokens=16, n_embd=1),
                 "info": attrs.evolve(fake_model_info(), generates=False)},
    "encoder": {"embedder": FakeEmbedder(pooling="mean", n_tokens=16),
                "info": attrs.evolve(fake_model_info(), generates=False)},
    "projector": {"vision": FakeVision()},
    "fill-in-the-middle": {"info": attrs.evolve(fake_model_info(), fim=FimTokens(pre=5, suf=6, mid=7))},
    "thinking template": {"thinking": True},
}  # fmt: skip


@pytest.fixture(name="served", params=list(SETUPS))
async def _served(request, settings, make_runtime, script) -> AsyncIterator[Any]:
    setup = dict(SETUPS[request.param])
    runtime = make_runtime()
    if setup.pop("thinking", False):
        template = ChatTemplate(QWEN3_STYLE.read_text(), bos_token="", eos_token="<|im_end|>", origin="test")
        runtime = attrs.evolve(runtime, template=template)
    runtime = attrs.evolve(runtime, engine=FakeEngine(script=script, **setup))
    app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


async def listed(served: Any) -> tuple[list[str], list[list[str]], list[str]]:
    client = served.test_client()
    shown = await (await client.post("/api/show", json={"model": "bubo"})).get_json()
    models = await (await client.get("/v1/models")).get_json()
    props = await (await client.get("/props")).get_json()
    return shown["capabilities"], [m["capabilities"] for m in models["models"]], props["capabilities"]


async def test_ollamas_words_answer_200_exactly_where_listed(served: Any) -> None:
    ollama, _, _ = await listed(served)
    client = served.test_client()
    for word, (path, body) in OLLAMA_PROBES.items():
        status = (await client.post(path, json=body)).status_code
        assert (word, status == 200) == (word, word in ollama)


async def test_llama_servers_words_answer_200_exactly_where_listed(served: Any) -> None:
    _, models, props = await listed(served)
    assert all(words == props for words in models)
    client = served.test_client()
    for word, (path, body) in LLAMA_PROBES.items():
        status = (await client.post(path, json=body)).status_code
        assert (word, status == 200) == (word, word in props)


async def test_the_dialects_agree(served: Any) -> None:
    """Ollama's ``vision`` is llama-server's ``multimodal``; Ollama has no word for ranking."""
    ollama, _, props = await listed(served)
    shared = {"completion": "completion", "vision": "multimodal", "embedding": "embedding"}
    assert {shared[w] for w in ollama if w in shared} == {w for w in props if w != "rerank"}
