"""POST /v1/messages and /v1/messages/count_tokens over the fake engine."""

from __future__ import annotations

import json

import pytest
from dirty_equals import IsInt, IsStr

from bubo.api.anthropic.stream import MessageStream
from bubo.domain.generation import GenerationStats, PromptProgress, StopCause
from bubo.domain.output import Done, ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from bubo.engine.fake import FakeEngine, FakeScript

PATH = "/v1/messages"
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "some-beta-2025"}


def message(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "bubo",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    body.update(fields)
    return body


def events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n", 1)
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


class TestMessages:
    async def test_response_shape(self, app, script: FakeScript) -> None:
        """A message has type, msg_ id, text content, stop_reason and Anthropic usage."""
        script.reply = "Hello there"
        response = await app.test_client().post(PATH + "?beta=true", json=message(), headers=HEADERS)
        assert response.status_code == 200
        assert await response.get_json() == {
            "id": IsStr(regex=r"msg_[0-9a-f]{32}"),
            "type": "message",
            "role": "assistant",
            "model": "bubo",
            "content": [{"type": "text", "text": "Hello there"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": IsInt,
                "output_tokens": 2,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
        }

    @pytest.mark.parametrize(
        ("fields", "reason", "sequence"),
        [
            ({"max_tokens": 1}, "max_tokens", None),
            ({"stop_sequences": [" there"]}, "stop_sequence", " there"),
        ],
    )
    async def test_stop_reasons(self, app, script: FakeScript, fields, reason, sequence) -> None:
        """max_tokens and stop_sequence stops are reported as such."""
        script.reply = "Hello there friend"
        body = await (await app.test_client().post(PATH, json=message(**fields))).get_json()
        assert (body["stop_reason"], body["stop_sequence"]) == (reason, sequence)

    async def test_cached_prompt_tokens_are_cache_reads(self, app, script: FakeScript) -> None:
        """A repeated prompt reports most input as cache_read_input_tokens."""
        client = app.test_client()
        first = (await (await client.post(PATH, json=message())).get_json())["usage"]
        second = (await (await client.post(PATH, json=message())).get_json())["usage"]
        assert second["cache_read_input_tokens"] == first["input_tokens"] - 1
        assert second["input_tokens"] + second["cache_read_input_tokens"] == first["input_tokens"]

    async def test_conversation_reaches_the_template(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """System blocks, tool use, tool results and thinking are rendered, in order."""
        body = message(
            system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
            messages=[
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "Thanks!"},
                ]},
            ],
            tools=[{"name": "weather", "description": "Get weather", "input_schema": {"type": "object"}}],
        )  # fmt: skip
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 200
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert "<|im_start|>system\nBe brief.\nBe kind.\n\n# Tools" in prompt
        assert (
            prompt.index("Let me check.") < prompt.index("<|im_start|>tool\nSunny") < prompt.index("Thanks!")
        )

    async def test_server_tools_are_skipped(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """Server tool types (web search, bash, …) are skipped, not rejected: only client tools reach the model."""
        tools = [
            {"type": "web_search_20250305", "name": "web_search"},
            {"name": "lookup_order", "input_schema": {"type": "object"}},
        ]
        response = await app.test_client().post(PATH, json=message(tools=tools))
        assert response.status_code == 200
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert "lookup_order" in prompt
        assert "web_search" not in prompt

    async def test_streaming_event_sequence(self, app, script: FakeScript) -> None:
        """message_start, a text block, message_delta with usage, message_stop."""
        script.reply = "Hello there"
        response = await app.test_client().post(PATH, json=message(stream=True))
        assert response.headers["Content-Type"].startswith("text/event-stream")
        stream = events(await response.get_data())
        names = [name for name, _ in stream]
        assert names == [
            "message_start", "content_block_start", "content_block_delta", "content_block_delta",
            "content_block_stop", "message_delta", "message_stop",
        ]  # fmt: skip
        assert all(data["type"] == name for name, data in stream)
        start = stream[0][1]["message"]
        assert (start["role"], start["content"], start["stop_reason"]) == ("assistant", [], None)
        assert start["usage"]["output_tokens"] == 0
        assert stream[1][1] == {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        assert "".join(d["delta"]["text"] for n, d in stream if n == "content_block_delta") == "Hello there"
        delta = stream[-2][1]
        assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
        assert delta["usage"]["output_tokens"] == 2


class TestErrors:
    @pytest.mark.parametrize(
        ("body", "status", "kind", "code", "fragment"),
        [
            ({"model": "bubo", "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "parse_error", "max_tokens"),
            ({"model": "bubo", "max_tokens": 5}, 400, "invalid_request_error", "missing_messages", "messages"),
            ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "missing_model", "model"),
            ({"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, 404, "not_found_error", "model_not_found", "claude-x"),
            ({"model": "bubo", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "invalid_request", "max_tokens"),
            ({"model": "bubo", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "invalid_request_error", "unsupported_content", "text only"),
            ({"model": "bubo", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]}, 400, "invalid_request_error", "invalid_request", "tool_use"),
        ],
    )  # fmt: skip
    async def test_anthropic_envelope(self, app, body, status, kind, code, fragment) -> None:
        """Errors on /v1/messages use Anthropic's envelope with the stable code and a request id."""
        response = await app.test_client().post(PATH, json=body, headers={"X-Request-Id": "req-abc"})
        assert response.status_code == status
        payload = await response.get_json()
        assert payload == {
            "type": "error",
            "error": {"type": kind, "message": IsStr, "code": code},
            "request_id": "req-abc",
        }
        assert fragment in payload["error"]["message"]
        assert response.headers["X-Request-Id"] == "req-abc"

    async def test_invalid_json(self, app) -> None:
        """A broken body is invalid_request_error with parse_error."""
        response = await app.test_client().post(PATH, data=b"{", headers={"Content-Type": "application/json"})
        payload = await response.get_json()
        assert (payload["error"]["type"], payload["error"]["code"]) == (
            "invalid_request_error",
            "parse_error",
        )
        assert payload["request_id"] == IsStr(regex="req_[0-9a-f]{32}")


class TestCountTokens:
    async def test_equals_the_prompt_of_a_real_request(self, app, fake_engine: FakeEngine) -> None:
        """count_tokens equals the prompt tokens generation evaluates for the same body."""
        body = message(
            system="Be brief.",
            tools=[
                {
                    "name": "f",
                    "description": "d",
                    "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                }
            ],
        )
        client = app.test_client()
        counted = await (
            await client.post(
                PATH + "/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"}
            )
        ).get_json()
        await client.post(PATH, json=body)
        assert counted == {"input_tokens": len(fake_engine.requests[-1].prompt_tokens)}

    async def test_longer_than_the_context(self, app) -> None:
        """A prompt longer than the context is still counted (clients size before trimming)."""
        long = "word " * 5000
        response = await app.test_client().post(
            PATH + "/count_tokens", json={"model": "bubo", "messages": [{"role": "user", "content": long}]}
        )
        assert response.status_code == 200
        assert (await response.get_json())["input_tokens"] > 2048

    @pytest.mark.parametrize(
        ("body", "code"),
        [
            ({"model": "bubo", "messages": [{"role": "user", "content": "x"}], "stream": True}, "invalid_request"),
            ({"model": "bubo", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "unsupported_content"),
            ({"model": "bubo"}, "missing_messages"),
        ],
    )  # fmt: skip
    async def test_errors(self, app, body, code) -> None:
        """Streaming and images are clear 400s in the Anthropic envelope."""
        response = await app.test_client().post(PATH + "/count_tokens", json=body)
        assert response.status_code == 400
        payload = await response.get_json()
        assert payload["type"] == "error"
        assert payload["error"]["code"] == code


class TestStreamEncoder:
    def encode(self, *output) -> list[tuple[str, dict]]:
        stream = MessageStream(message_id="msg_1", model="bubo", prompt_tokens=10, request_id="req_1")
        frames = b"".join([*stream.opening(), *(f for e in output for f in stream.encode(e))])
        return events(frames)

    def test_thinking_text_and_tool_use_blocks(self) -> None:
        """Thinking, text and tool-use blocks open and close in order with their delta types."""
        done = Done(
            finish_reason="tool_calls",
            cause=StopCause.EOS,
            stats=GenerationStats(prompt_tokens=10, cached_tokens=4, completion_tokens=9),
        )
        stream = self.encode(
            PromptProgress(total=10, cached=4, processed=3, elapsed_ms=1.0),
            PromptProgress(total=10, cached=4, processed=6, elapsed_ms=2.0),
            ReasoningDelta(text="hmm"),
            TextDelta(text="Calling."),
            ToolCallStart(index=0, id="call_abc", name="weather"),
            ToolCallArgumentsDelta(index=0, fragment='{"city": '),
            ToolCallArgumentsDelta(index=0, fragment='"Oslo"}'),
            done,
        )  # fmt: skip
        assert [n for n, _ in stream] == [
            "message_start", "ping",
            "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop",
        ]  # fmt: skip
        assert stream[0][1]["message"]["usage"] == {
            "input_tokens": 6, "output_tokens": 0, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 0,
        }  # fmt: skip
        assert stream[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
        assert stream[3][1]["delta"] == {"type": "thinking_delta", "thinking": "hmm"}
        assert stream[4][1]["delta"] == {"type": "signature_delta", "signature": ""}
        assert stream[9][1]["content_block"] == {
            "type": "tool_use",
            "id": "toolu_abc",
            "name": "weather",
            "input": {},
        }
        assert [d["delta"]["partial_json"] for n, d in stream[10:12]] == ['{"city": ', '"Oslo"}']
        assert [d.get("index") for n, d in stream if n.startswith("content_block")] == [
            0,
            0,
            0,
            0,
            1,
            1,
            1,
            2,
            2,
            2,
            2,
        ]
        assert stream[-2][1]["delta"]["stop_reason"] == "tool_use"

    def test_error_event(self) -> None:
        """An error after the headers is event: error with the envelope."""
        from bubo.errors import InternalError

        stream = MessageStream(message_id="msg_1", model="bubo", prompt_tokens=1, request_id="req_9")
        name, data = events(b"".join(stream.error(InternalError("boom"))))[0]
        assert name == "error"
        assert data == {
            "type": "error",
            "error": {"type": "api_error", "message": "boom", "code": "internal_error"},
            "request_id": "req_9",
        }
