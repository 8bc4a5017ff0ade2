"""LoRA adapters over HTTP, as llama-server has them: /lora-adapters, a request's ``lora``, /props, /slots.

A request's ``lora`` is taken on every generating route: llama-server's and OpenAI's, where llama-server
takes it, and Anthropic's and the Responses API too (llama-server turns those into chat requests).

The fake engine holds two adapters (it applies none; tests/engine/test_lora.py decodes with real ones):
what is checked here is which scales each request reaches the engine with, and the errors.
"""

from __future__ import annotations

import pytest

from bubo.engine.fake import FakeEngine, FakeScript
from bubo.engine.lora import LoraAdapter

ADAPTERS = [
    LoraAdapter(id=0, path="/models/tone.gguf", scale=1.0),
    LoraAdapter(id=1, path="/models/style.gguf", scale=0.0),
]
MODEL = "smollm2-135m-instruct-q4-1"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(name="fake_engine")
def _fake_engine(script: FakeScript) -> FakeEngine:
    return FakeEngine(script=script, lora=ADAPTERS)


class TestTheGlobalScales:
    async def test_get_lists_each_adapter_by_id(self, app) -> None:
        response = await app.test_client().get("/lora-adapters")
        assert response.status_code == 200
        assert await response.get_json() == [
            {"id": 0, "path": "/models/tone.gguf", "scale": 1.0},
            {"id": 1, "path": "/models/style.gguf", "scale": 0.0},
        ]

    async def test_post_sets_the_listed_ones_and_the_others_to_zero(self, app, fake_engine) -> None:
        client = app.test_client()
        response = await client.post("/lora-adapters", json=[{"id": 1, "scale": 0.5}])
        assert response.status_code == 200
        assert await response.get_json() == {"success": True}
        listed = await (await client.get("/lora-adapters")).get_json()
        assert [entry["scale"] for entry in listed] == [0.0, 0.5]
        await client.post("/completion", json={"prompt": "x", "n_predict": 1})
        assert fake_engine.requests[-1].lora == (0.0, 0.5)  # a later request without lora gets them

    async def test_props_shows_them_in_the_default_generation_settings(self, app) -> None:
        props = await (await app.test_client().get("/props")).get_json()
        assert props["default_generation_settings"]["params"]["lora"] == [
            {"id": 0, "scale": 1.0},
            {"id": 1, "scale": 0.0},
        ]

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ([{"id": 2, "scale": 1.0}], "[0].id"),
            ([{"id": 0, "scale": 1.0}, {"id": -1, "scale": 1.0}], "[1].id"),
            ([{"id": "0", "scale": 1.0}], "[0].id"),
            ([{"scale": 1.0}], "[0].id"),
            ([{"id": 0, "scale": "high"}], "[0].scale"),
        ],
    )
    async def test_a_bad_entry_is_a_400_naming_it_and_changes_nothing(self, app, body, param) -> None:
        client = app.test_client()
        response = await client.post("/lora-adapters", json=body)
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param
        listed = await (await client.get("/lora-adapters")).get_json()
        assert [entry["scale"] for entry in listed] == [1.0, 0.0]

    async def test_a_body_that_is_not_an_array_is_a_400(self, app) -> None:
        response = await app.test_client().post("/lora-adapters", json={"id": 0, "scale": 1.0})
        assert response.status_code == 400
        assert "JSON array" in (await response.get_json())["error"]["message"]


class TestARequestsOwnLora:
    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/completion", {"prompt": "x"}),
            ("/v1/completions", {"model": MODEL, "prompt": "x"}),
            ("/v1/chat/completions", CHAT),
            ("/v1/messages", CHAT),
            ("/v1/responses", {"model": MODEL, "input": "hi"}),
        ],
    )
    async def test_names_its_adapters_and_leaves_the_others_at_zero(
        self, app, fake_engine, path, body
    ) -> None:
        limit = {"max_output_tokens": 16} if path == "/v1/responses" else {"max_tokens": 1}
        response = await app.test_client().post(
            path, json={**body, **limit, "lora": [{"id": 1, "scale": 0.75}]}
        )
        assert response.status_code == 200
        assert fake_engine.requests[-1].lora == (0.0, 0.75)

    async def test_without_one_the_engine_applies_the_global_scales(self, app, fake_engine) -> None:
        await app.test_client().post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
        assert fake_engine.requests[-1].lora == (1.0, 0.0)

    async def test_an_empty_list_is_the_base_model(self, app, fake_engine) -> None:
        await app.test_client().post("/v1/chat/completions", json={**CHAT, "max_tokens": 1, "lora": []})
        assert fake_engine.requests[-1].lora == (0.0, 0.0)

    @pytest.mark.parametrize(
        ("lora", "param"),
        [
            ([{"id": 5, "scale": 1.0}], "lora[0].id"),
            ([{"id": 0, "scale": 1.0}, {"id": 9}], "lora[1].id"),
            ({"id": 0, "scale": 1.0}, "lora"),
        ],
    )
    async def test_a_bad_one_is_a_400_naming_it(self, app, fake_engine, lora, param) -> None:
        response = await app.test_client().post("/v1/chat/completions", json={**CHAT, "lora": lora})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param
        assert not fake_engine.requests

    async def test_slots_shows_the_scales_of_the_slots_task(self, app) -> None:
        client = app.test_client()
        await client.post(
            "/completion", json={"prompt": "x", "n_predict": 1, "lora": [{"id": 0, "scale": 0.25}]}
        )
        slots = await (await client.get("/slots")).get_json()
        assert slots[0]["params"]["lora"] == [{"id": 0, "scale": 0.25}, {"id": 1, "scale": 0.0}]
