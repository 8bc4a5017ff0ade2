"""Request shapes llama-server takes and answers it gives, over the fake engine.

Prompts as objects and mixed arrays, ``response_fields: []``, ``ignore_eos`` in
``generation_settings``, the chat token count, and embeddings inputs given as
content parts: each as llama.cpp's own server tests (tools/server/tests) send them.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from tests.conftest import wait_until_ready

from bubo.engine.fake import FakeEmbedder, FakeEngine, FakeScript
from bubo.server import create_app

CHAT = {
    "messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
}


async def _completion(app, **body):
    response = await app.test_client().post("/completion", json={"n_predict": 4, **body})
    return response.status_code, await response.get_json()


class TestPrompts:
    async def test_an_object_is_one_prompt(self, app, script: FakeScript) -> None:
        """{"prompt_string": text} is the text's prompt."""
        script.reply = " ok"
        status, by_object = await _completion(app, prompt={"prompt_string": "Count:"})
        assert status == 200
        _, by_text = await _completion(app, prompt="Count:")
        assert (by_object["prompt"], by_object["content"]) == (by_text["prompt"], by_text["content"])

    async def test_objects_among_several_prompts(self, app, tokenizer) -> None:
        """Texts, token arrays (mixed with texts) and objects are several prompts, answered in order."""
        ids = tokenizer.encode("Count:")
        status, body = await _completion(
            app, prompt=["Count:", [*ids, " one"], {"prompt_string": "Count:"}, {"prompt_string": [*ids]}]
        )
        assert status == 200
        assert [result["index"] for result in body] == [0, 1, 2, 3]
        assert body[1]["prompt"] == "Count: one"
        assert body[0]["prompt"] == body[2]["prompt"] == body[3]["prompt"]

    async def test_ids_and_texts_mixed_are_one_prompt(self, app) -> None:
        """[1, 2, "text", 3, "text"] is one prompt, as llama-server reads it."""
        status, body = await _completion(app, prompt=[1, 2, 3, "I believe", 7, 8, "life is"])
        assert status == 200
        assert isinstance(body, dict)
        assert body["prompt"].endswith("life is")

    @pytest.mark.parametrize(
        ("prompt", "param"),
        [
            ({"prompt_string": "<__media__>", "multimodal_data": ["AAAA"]}, "prompt.multimodal_data"),
            (["a", {"prompt_string": "x", "multimodal_data": ["AAAA"]}], "prompt[1].multimodal_data"),
            ({"multimodal_data": []}, "prompt.prompt_string"),
            (["a", {"prompt_string": ""}], "prompt[1].prompt_string"),
            ([[1, 2], 3], "prompt[1]"),
        ],
    )
    async def test_refused_shapes(self, app, prompt, param) -> None:
        """Media (a text model has no use for it), an object without text, an empty one: 400 at the path."""
        status, body = await _completion(app, prompt=prompt)
        assert status == 400
        assert body["error"]["param"] == param


class TestResults:
    async def test_empty_response_fields_is_the_whole_result(self, app) -> None:
        """response_fields: [] names no field: the whole result (test_completion_response_fields)."""
        _, body = await _completion(app, prompt="Count:", response_fields=[])
        assert {"content", "generation_settings", "timings", "prompt"} <= body.keys()

    async def test_named_fields_project(self, app) -> None:
        """Named fields still project, a nested one under its path."""
        _, body = await _completion(
            app, prompt="Count:", response_fields=["content", "generation_settings/n_predict"]
        )
        assert body.keys() == {"content", "generation_settings/n_predict"}
        assert body["generation_settings/n_predict"] == 4

    async def test_ignore_eos_bans_every_end_token(self, app, fake_engine: FakeEngine) -> None:
        """ignore_eos adds a ban (bias null) for each end-of-generation token, as llama-server shows it."""
        _, body = await _completion(app, prompt="Count:", ignore_eos=True)
        eog = sorted(fake_engine.info.eog_token_ids)
        assert body["generation_settings"]["ignore_eos"] is True
        assert body["generation_settings"]["logit_bias"] == [{"token": t, "bias": None} for t in eog]
        _, plain = await _completion(app, prompt="Count:")
        assert plain["generation_settings"]["logit_bias"] == []

    async def test_ignore_eos_keeps_the_requests_own_biases(self, app, fake_engine: FakeEngine) -> None:
        """A request's own biases stay, the end tokens' bans come after them."""
        _, body = await _completion(app, prompt="Count:", ignore_eos=True, logit_bias=[[5, 1.5]])
        entries = body["generation_settings"]["logit_bias"]
        assert entries[0] == {"token": 5, "bias": 1.5}
        assert {e["token"] for e in entries[1:]} == set(fake_engine.info.eog_token_ids)


class TestChatInputTokens:
    @pytest.mark.parametrize("path", ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"])
    async def test_count_equals_the_prompt_a_chat_evaluates(self, app, path) -> None:
        """The count is the chat completion's prompt_tokens, in llama-server's envelope; model optional."""
        client = app.test_client()
        counted = await (await client.post(path, json=CHAT)).get_json()
        chat = await (
            await client.post("/v1/chat/completions", json={"model": "bubo", "max_tokens": 1, **CHAT})
        ).get_json()
        assert counted == {"object": "response.input_tokens", "input_tokens": chat["usage"]["prompt_tokens"]}
        assert counted["input_tokens"] > 5

    async def test_a_named_model_must_be_served(self, app) -> None:
        """A model that is not served is 404, as on chat completions."""
        response = await app.test_client().post(
            "/v1/chat/completions/input_tokens", json={"model": "nope", **CHAT}
        )
        assert response.status_code == 404


@pytest.fixture(name="emb_app")
async def _emb_app(settings, make_runtime, script):
    runtime = attrs.evolve(
        make_runtime(), engine=FakeEngine(script=script, embedder=FakeEmbedder(pooling="last", n_tokens=64))
    )
    app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


class TestEmbeddingInputs:
    async def _vectors(self, app, value, path="/v1/embeddings"):
        response = await app.test_client().post(path, json={"input": value})
        return response.status_code, await response.get_json()

    async def test_text_parts_embed_as_their_text(self, emb_app) -> None:
        """{"content": [text parts]} embeds as the joined text (test_embedding_content_text_same_as_string)."""
        status, body = await self._vectors(
            emb_app,
            [
                "hello world",
                {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
            ],
        )
        assert status == 200
        assert body["data"][0]["embedding"] == body["data"][1]["embedding"]

    @pytest.mark.parametrize(
        ("value", "count"),
        [
            ([12, 34, "string", 56, 78], 1),
            ({"prompt_string": "string"}, 1),
            ({"content": [{"type": "text", "text": "string"}]}, 1),
            (
                ["string1", {"prompt_string": "string2"}, {"content": [{"type": "text", "text": "string3"}]}],
                3,
            ),
            ([[12, 34, 56], [12, "string", 34, 56]], 2),
        ],
    )
    async def test_mixed_shapes(self, emb_app, value, count) -> None:
        """Every shape of test_embedding_mixed_input gives one vector per input."""
        status, body = await self._vectors(emb_app, value)
        assert status == 200
        assert len(body["data"]) == count

    async def test_mixed_ids_and_text_embed_as_the_prompt_they_spell(self, emb_app, tokenizer) -> None:
        """Ids and texts mixed are tokenized as a raw prompt: the same vector as its ids."""
        ids = tokenizer.encode("hello")
        _, mixed = await self._vectors(emb_app, [*ids, " world"])
        _, by_ids = await self._vectors(emb_app, [*ids, *tokenizer.encode(" world")])
        assert np.allclose(mixed["data"][0]["embedding"], by_ids["data"][0]["embedding"])

    @pytest.mark.parametrize(
        ("value", "param", "code"),
        [
            ([], "input", "invalid_request"),
            ({"content": "string"}, "input.content", "invalid_request"),
            ({"content": [{"type": "unknown"}]}, "input.content[0]", "invalid_request"),
            (
                {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
                "input.content[0].type",
                "not_multimodal",
            ),
            (
                {"content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
                "input.content[0].type",
                "not_multimodal",
            ),
            ({"prompt_string": "x", "multimodal_data": ["AAAA"]}, "input.multimodal_data", "invalid_request"),
        ],
    )
    async def test_invalid_inputs(self, emb_app, value, param, code) -> None:
        """What test_embedding_invalid_input sends is a 400 naming the element (media: not_multimodal)."""
        status, body = await self._vectors(emb_app, value)
        assert status == 400
        assert (body["error"]["param"], body["error"]["code"]) == (param, code)

    async def test_llama_server_route_takes_the_same_shapes(self, emb_app) -> None:
        """/embedding reads content parts too."""
        response = await emb_app.test_client().post(
            "/embedding", json={"content": {"content": [{"type": "text", "text": "hi"}]}}
        )
        assert response.status_code == 200
        assert len(await response.get_json()) == 1
