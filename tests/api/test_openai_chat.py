"""POST /v1/chat/completions over the fake engine: shapes, fields and errors."""

from __future__ import annotations

import json

import pytest
from dirty_equals import IsInt, IsNumber, IsPositiveInt, IsStr

from bubo.engine.fake import FakeEngine, FakeScript

CHAT = "/v1/chat/completions"


def chat(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {"model": "bubo", "messages": [{"role": "user", "content": "Say hi."}]}
    body.update(fields)
    return body


def sse_events(body: bytes) -> list[str]:
    return [line.removeprefix("data: ") for line in body.decode().split("\n\n") if line]


class TestNonStreaming:
    async def test_response_shape(self, app, script: FakeScript) -> None:
        """A chat completion has the OpenAI shape, usage with speeds and cache, and timings."""
        script.reply = "Hi there!"
        response = await app.test_client().post(CHAT, json=chat(max_tokens=32))
        assert response.status_code == 200
        body = await response.get_json()
        assert body == {
            "id": IsStr(regex=r"chatcmpl-[0-9a-f]{32}"),
            "object": "chat.completion",
            "created": IsInt,
            "model": "bubo",
            "system_fingerprint": IsStr,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi there!"},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": IsPositiveInt,
                "completion_tokens": 2,
                "total_tokens": IsPositiveInt,
                "prompt_tokens_details": {"cached_tokens": IsInt, "shared_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
                "prompt_tokens_per_second": IsNumber,
                "completion_tokens_per_second": IsNumber,
                "draft_tokens": 0,
                "draft_tokens_accepted": 0,
                "gufo": {
                    "cache_hit": False,
                    "cache_miss_reason": "cold",
                    "cached_tokens": 0,
                    "cache_snapshots_skipped": 0,
                    "cache_restored_bytes": 0,
                },
            },
            "timings": {
                "cache_n": 0,
                "shared_tokens": 0,
                "prompt_n": IsPositiveInt,
                "prompt_ms": IsNumber,
                "prompt_per_token_ms": IsNumber,
                "prompt_per_second": IsNumber,
                "predicted_n": 2,
                "predicted_ms": IsNumber,
                "predicted_per_token_ms": IsNumber,
                "predicted_per_second": IsNumber,
            },
        }
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2

    async def test_prompt_is_the_rendered_template(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """The engine receives the chat template's rendering, tokenized."""
        await app.test_client().post(CHAT, json=chat())
        expected = (
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
        )
        assert fake_engine.requests[-1].prompt_tokens == tuple(tokenizer.encode(expected))

    async def test_max_tokens_limits_and_reports_length(self, app, script: FakeScript) -> None:
        """max_tokens cuts the reply; finish_reason is length."""
        script.reply = "one two three four five"
        body = await (await app.test_client().post(CHAT, json=chat(max_tokens=2))).get_json()
        assert body["choices"][0]["message"]["content"] == "one two"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2

    @pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
    @pytest.mark.parametrize("value", [-1, None])
    async def test_minus_one_or_null_keeps_the_default(
        self, app, fake_engine: FakeEngine, field, value
    ) -> None:
        """max_tokens -1 or null means the server default (no limit here)."""
        response = await app.test_client().post(CHAT, json=chat(**{field: value}))
        assert response.status_code == 200
        assert fake_engine.requests[-1].max_new_tokens is None

    async def test_max_completion_tokens_wins(self, app, fake_engine: FakeEngine) -> None:
        """max_completion_tokens takes precedence over max_tokens."""
        await app.test_client().post(CHAT, json=chat(max_tokens=50, max_completion_tokens=7))
        assert fake_engine.requests[-1].max_new_tokens == 7

    async def test_stop_string(self, app, script: FakeScript) -> None:
        """A stop string ends the reply before it; finish_reason is stop."""
        script.reply = "alpha beta gamma delta"
        body = await (await app.test_client().post(CHAT, json=chat(stop=" gamma"))).get_json()
        assert body["choices"][0]["message"]["content"] == "alpha beta"
        assert body["choices"][0]["finish_reason"] == "stop"

    async def test_sampling_fields_reach_the_engine(self, app, fake_engine: FakeEngine) -> None:
        """Sampling fields override the server defaults one by one."""
        await app.test_client().post(
            CHAT,
            json=chat(
                temperature=0.1,
                top_p=0.5,
                top_k=7,
                min_p=0.2,
                seed=42,
                presence_penalty=0.3,
                frequency_penalty=0.4,
                repeat_penalty=1.2,
                logit_bias={"15": -100, "16": 5},
            ),
        )
        sampling = fake_engine.requests[-1].sampling
        assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.seed) == (
            0.1,
            0.5,
            7,
            0.2,
            42,
        )
        assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repeat_penalty) == (
            0.3,
            0.4,
            1.2,
        )
        assert dict(sampling.logit_bias) == {15: -100.0, 16: 5.0}

    async def test_logprobs(self, app, script: FakeScript) -> None:
        """logprobs with top_logprobs returns one entry per token with alternatives."""
        script.reply = "a b"
        body = await (await app.test_client().post(CHAT, json=chat(logprobs=True, top_logprobs=2))).get_json()
        content = body["choices"][0]["logprobs"]["content"]
        assert [entry["token"] for entry in content] == ["a", " b"]
        assert all(len(entry["top_logprobs"]) == 2 for entry in content)
        assert content[0] == {
            "id": IsInt,
            "token": "a",
            "logprob": -0.5,
            "bytes": [97],
            "top_logprobs": [
                {"id": IsInt, "token": "a", "logprob": -0.5, "bytes": [97]},
                {"id": IsInt, "token": "a", "logprob": -1.5, "bytes": [97]},
            ],
        }

    async def test_unknown_fields_are_ignored(self, app) -> None:
        """Fields Bubo does not know are ignored, not rejected."""
        response = await app.test_client().post(CHAT, json=chat(some_vendor_field={"x": 1}, store=True))
        assert response.status_code == 200

    async def test_content_parts_are_joined(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """Text parts of a message's content array reach the template as text."""
        parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi."}]
        await app.test_client().post(CHAT, json=chat(messages=[{"role": "user", "content": parts}]))
        assert "Say\nhi." in tokenizer.decode(fake_engine.requests[-1].prompt_tokens)

    async def test_developer_role_is_a_system_message(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """OpenAI's developer role renders as system."""
        messages = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
        await app.test_client().post(CHAT, json=chat(messages=messages))
        assert "<|im_start|>system\nBe terse.<|im_end|>" in tokenizer.decode(
            fake_engine.requests[-1].prompt_tokens
        )

    async def test_the_alias_and_the_served_id_both_work(self, app) -> None:
        """Requests may name the model by its id or as bubo."""
        client = app.test_client()
        for name in ("bubo", "smollm2-135m-instruct-q4-1"):
            response = await client.post(CHAT, json=chat(model=name))
            assert response.status_code == 200
            assert (await response.get_json())["model"] == name


class TestStreaming:
    async def test_event_sequence(self, app, script: FakeScript) -> None:
        """Role chunk, content chunks, a finish chunk with timings, a usage chunk, then [DONE]."""
        script.reply = "Hi there!"
        response = await app.test_client().post(
            CHAT, json=chat(stream=True, stream_options={"include_usage": True})
        )
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await response.get_data())
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        # llama-server's role chunk: content null, not "" (its own suite checks `content is None`)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "Hi there!"
        finish, usage = chunks[-2], chunks[-1]
        assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
        assert finish["timings"]["predicted_n"] == 2
        assert usage["choices"] == []
        assert usage["usage"]["completion_tokens"] == 2
        assert usage["timings"] == finish["timings"]  # on the last chunk, as llama-server has them
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])

    async def test_no_usage_chunk_unless_asked(self, app) -> None:
        """Without include_usage the finish chunk is the last before [DONE]."""
        events = sse_events(await (await app.test_client().post(CHAT, json=chat(stream=True))).get_data())
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
        assert all("usage" not in json.loads(e) for e in events[:-1])

    async def test_engine_failure_mid_stream_is_an_error_event(self, app, script: FakeScript) -> None:
        """After headers, an engine failure becomes an error data event and the stream ends."""
        script.reply = "one two three"
        script.fail_after = 1
        events = sse_events(await (await app.test_client().post(CHAT, json=chat(stream=True))).get_data())
        error = json.loads(events[-1])
        assert error == {
            "error": {"message": IsStr, "type": "server_error", "param": None, "code": "engine_error"}
        }


class TestContentATextModelCannotRead:
    IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}

    async def test_images_in_earlier_turns_and_tool_results_are_placeholders(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """An image a tool returned, or one in an earlier turn, is read as a placeholder; the header counts them."""
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, self.IMAGE]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": [self.IMAGE]},
            {"role": "user", "content": "And now?"},
        ]  # fmt: skip
        response = await app.test_client().post(
            "/v1/chat/completions", json={"model": "bubo", "messages": messages}
        )
        assert response.status_code == 200
        assert response.headers["Bubo-Omitted-Content"] == "image=2"
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert prompt.count("[image omitted: this model reads text only]") == 2
