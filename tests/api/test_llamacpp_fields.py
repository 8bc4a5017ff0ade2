"""/completion's context, result and multi-prompt fields over the fake engine.

``n_keep``, ``cache_prompt``, ``n_indent``, ``return_tokens``, ``response_fields``,
``generation_settings.logit_bias``, and several prompts in one request.
"""

from __future__ import annotations

import math

import attrs
import pytest

from bubo.domain.sampling import GenerationDefaults
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.server import create_app

from .._sse import payloads as events
from ..conftest import wait_until_ready


class TestContextFields:
    async def test_n_keep_cache_prompt_and_n_indent_reach_the_engine(
        self, app, fake_engine: FakeEngine
    ) -> None:
        await app.test_client().post(
            "/completion", json={"prompt": "x", "n_keep": 12, "cache_prompt": False, "n_indent": 4}
        )
        request = fake_engine.requests[-1]
        assert (request.n_keep, request.cache_prompt, request.n_indent) == (12, False, 4)

    async def test_defaults_reuse_the_cache_and_keep_nothing(self, app, fake_engine: FakeEngine) -> None:
        await app.test_client().post("/completion", json={"prompt": "x"})
        request = fake_engine.requests[-1]
        assert (request.n_keep, request.cache_prompt, request.n_indent) == (0, True, 0)

    async def test_without_n_keep_the_servers_keep_applies(self, settings, make_runtime, fake_engine) -> None:
        runtime = attrs.evolve(make_runtime(), defaults=GenerationDefaults(n_keep=6))
        app = create_app(settings, load=lambda _settings, _progress: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            client = test_app.test_client()
            await client.post("/completion", json={"prompt": "x"})
            assert fake_engine.requests[-1].n_keep == 6
            await client.post("/completion", json={"prompt": "x", "n_keep": 0})
            assert fake_engine.requests[-1].n_keep == 0
            props = await (await client.get("/props")).get_json()
            assert props["default_generation_settings"]["params"]["n_keep"] == 6

    async def test_any_negative_n_keep_keeps_the_whole_prompt(self, app, fake_engine: FakeEngine) -> None:
        await app.test_client().post("/completion", json={"prompt": "x", "n_keep": -7})
        assert fake_engine.requests[-1].n_keep == -1

    async def test_generation_settings_show_them_and_the_resolved_logit_bias(self, app) -> None:
        response = await app.test_client().post(
            "/completion",
            json={"prompt": "x", "n_keep": 5, "n_indent": 2, "logit_bias": [[15, -1.5], [16, False]]},
        )
        settings = (await response.get_json())["generation_settings"]
        assert (settings["n_keep"], settings["n_indent"], settings["cache_prompt"]) == (5, 2, True)
        assert settings["logit_bias"] == [{"token": 15, "bias": -1.5}, {"token": 16, "bias": None}]

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"prompt": "x", "n_indent": -1}, "n_indent"),
            ({"prompt": "x", "n_keep": "all"}, "n_keep"),
            ({"prompt": "x", "cache_prompt": "no"}, "cache_prompt"),
            ({"prompt": "x", "response_fields": "content"}, "response_fields"),
            ({"prompt": "x", "response_fields": [1]}, "response_fields[0]"),
            ({"prompt": "x", "response_fields": ["content"] * 65}, "response_fields"),
            ({"prompt": "x", "response_fields": ["content", "a/" * 128 + "b"]}, "response_fields[1]"),
            ({"prompt": ["a", 5]}, "prompt"),  # one mixed prompt: fine (checked below), not an error
        ][:-1],
    )
    async def test_errors(self, app, body, param) -> None:
        response = await app.test_client().post("/completion", json=body)
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param


class TestReturnTokens:
    async def test_the_result_carries_the_generated_ids_only_when_asked(
        self, app, script: FakeScript
    ) -> None:
        script.reply = " one two"
        client = app.test_client()
        plain = await (await client.post("/completion", json={"prompt": "x"})).get_json()
        asked = await (
            await client.post("/completion", json={"prompt": "x", "return_tokens": True})
        ).get_json()
        assert plain["tokens"] == []
        assert len(asked["tokens"]) == asked["tokens_predicted"] == 2
        assert all(isinstance(t, int) for t in asked["tokens"])

    @pytest.mark.parametrize("return_tokens", [False, True])
    async def test_stream_chunks_always_carry_their_ids(self, app, script: FakeScript, return_tokens) -> None:
        """llama-server's stream sends each chunk's token ids either way (its suite checks them)."""
        script.reply = " one two"
        body = {"prompt": "x", "stream": True, "return_tokens": return_tokens}
        chunks = events(await (await app.test_client().post("/completion", json=body)).get_data())
        assert [len(c["tokens"]) for c in chunks[:-1]] == [1, 1]
        assert chunks[-1]["stop"] is True


class TestResponseFields:
    async def test_only_the_named_fields_a_nested_one_under_its_path(self, app, script: FakeScript) -> None:
        script.reply = " one two"
        body = await (
            await app.test_client().post(
                "/completion",
                json={
                    "prompt": "x",
                    "n_predict": 9,
                    "response_fields": [
                        "content",
                        "generation_settings/n_predict",
                        "no_such_field",
                        "stop/x",
                    ],
                },
            )
        ).get_json()
        assert body == {"content": " one two", "generation_settings/n_predict": 9}

    async def test_the_last_stream_chunk_is_projected(self, app, script: FakeScript) -> None:
        script.reply = " one two"
        chunks = events(
            await (
                await app.test_client().post(
                    "/completion", json={"prompt": "x", "stream": True, "response_fields": ["stop_type"]}
                )
            ).get_data()
        )
        assert chunks[-1] == {"stop_type": "eos"}
        assert chunks[0]["content"] == " one"


class TestSeveralPrompts:
    @pytest.mark.parametrize("prompt", ["a b", ["a", 5, "b"], [5, 6, 7], ["just one"], [[5, 6]]])
    async def test_one_prompt_is_one_object(self, app, fake_engine: FakeEngine, prompt) -> None:
        body = await (await app.test_client().post("/completion", json={"prompt": prompt})).get_json()
        assert isinstance(body, dict)
        assert len(fake_engine.requests) == 1

    async def test_each_prompt_gets_its_result_in_order(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        fake_engine.script.reply = lambda request: f" after {len(request.prompt_tokens)} tokens"
        prompts = ["one", "one two three", [5, 6], ["four", 7]]
        body = await (await app.test_client().post("/completion", json={"prompt": prompts})).get_json()
        assert isinstance(body, list)
        assert [r["index"] for r in body] == [0, 1, 2, 3]
        assert [r["prompt"] for r in body] == [
            "one",
            "one two three",
            tokenizer.decode([5, 6]),
            "four" + tokenizer.decode([7]),
        ]
        assert [r["content"] for r in body] == [f" after {r['tokens_evaluated']} tokens" for r in body]
        assert len(fake_engine.requests) == 4

    async def test_streamed_chunks_carry_their_prompt_index(self, app, script: FakeScript) -> None:
        script.reply = " one two"
        chunks = events(
            await (
                await app.test_client().post("/completion", json={"prompt": ["a", "b c"], "stream": True})
            ).get_data()
        )
        for index in (0, 1):
            own = [c for c in chunks if c["index"] == index]
            assert [c["content"] for c in own] == [" one", " two", ""]
            assert [c["stop"] for c in own] == [False, False, True]

    @pytest.mark.parametrize(
        ("prompt", "param"),
        [(["a", ""], "prompt[1]"), (["a", []], "prompt[1]"), (["a", [1], 2], "prompt[2]")],
    )
    async def test_bad_prompts_name_their_index(self, app, prompt, param) -> None:
        response = await app.test_client().post("/completion", json={"prompt": prompt})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param

    async def test_too_many_prompts_are_refused(self, app) -> None:
        response = await app.test_client().post("/completion", json={"prompt": ["a"] * 65})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "prompt"

    async def test_a_generation_failing_midway_ends_the_stream_with_an_error(
        self, app, fake_engine: FakeEngine
    ) -> None:
        fake_engine.script.reply = " one two three"
        fake_engine.script.fail_after = 1
        chunks = events(
            await (
                await app.test_client().post("/completion", json={"prompt": ["a", "b"], "stream": True})
            ).get_data()
        )
        assert "error" in chunks[-1]
        assert not any(c.get("stop") for c in chunks[:-1])
        fake_engine.script.fail_after = None
        again = await app.test_client().post("/completion", json={"prompt": ["a", "b"]})
        assert again.status_code == 200

    async def test_a_generation_failing_midway_fails_the_whole_answer(
        self, app, fake_engine: FakeEngine
    ) -> None:
        fake_engine.script.fail_after = 1
        response = await app.test_client().post("/completion", json={"prompt": ["a", "b"]})
        assert response.status_code >= 500
        assert "error" in await response.get_json()

    async def test_a_failing_prompt_fails_the_request(self, app, fake_engine: FakeEngine) -> None:
        """A prompt that does not fit the context is a 400 before any runs."""
        response = await app.test_client().post("/completion", json={"prompt": ["a", "word " * 5000]})
        assert response.status_code == 400
        assert fake_engine.requests == []


class TestPostSamplingProbs:
    async def test_the_flag_reaches_the_engine(self, app, fake_engine: FakeEngine) -> None:
        await app.test_client().post(
            "/completion", json={"prompt": "x", "n_probs": 2, "post_sampling_probs": True}
        )
        assert fake_engine.requests[-1].post_sampling_probs is True

    async def test_probabilities_replace_log_probabilities(self, app, script: FakeScript) -> None:
        script.reply = " one two"
        client = app.test_client()
        raw = await (await client.post("/completion", json={"prompt": "x", "n_probs": 2})).get_json()
        post = await (
            await client.post("/completion", json={"prompt": "x", "n_probs": 2, "post_sampling_probs": True})
        ).get_json()
        before, after = raw["completion_probabilities"][0], post["completion_probabilities"][0]
        assert set(after) == {"id", "token", "bytes", "prob", "top_probs"}
        assert after["prob"] == pytest.approx(math.exp(before["logprob"]))
        assert [set(t) for t in after["top_probs"]] == [{"id", "token", "bytes", "prob"}] * len(
            after["top_probs"]
        )

    async def test_streamed_chunks_carry_them_too(self, app, script: FakeScript) -> None:
        script.reply = " one two"
        chunks = events(
            await (
                await app.test_client().post(
                    "/completion",
                    json={"prompt": "x", "n_probs": 1, "post_sampling_probs": True, "stream": True},
                )
            ).get_data()
        )
        assert all("prob" in c["completion_probabilities"][0] for c in chunks[:-1])
