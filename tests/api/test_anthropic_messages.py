"""POST /v1/messages and /v1/messages/count_tokens over the fake engine."""

from __future__ import annotations

import json

import pytest
from dirty_equals import IsInt, IsStr

from bubo.api._converter import make_converter, structure
from bubo.api.anthropic import translate, wire
from bubo.api.anthropic.stream import MessageStream
from bubo.domain.generation import GenerationStats, PromptProgress, StopCause
from bubo.domain.output import Done, ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from bubo.engine.fake import FakeEngine, FakeScript

from .._sse import named as events

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


class TestEmptyMessages:
    @pytest.mark.parametrize("system", [None, "Be brief."])
    async def test_served_as_llama_server_serves_it(
        self, app, fake_engine: FakeEngine, script: FakeScript, tokenizer, system
    ) -> None:
        """``messages: []`` is a message (as in llama-server): the prompt is the system turn alone, or none,
        and the assistant's opened turn; count_tokens counts that same prompt."""
        script.reply = "Hello"
        body = message(messages=[]) if system is None else message(messages=[], system=system)
        client = app.test_client()
        response = await client.post(PATH, json=body)
        assert response.status_code == 200
        payload = await response.get_json()
        assert (payload["type"], payload["content"]) == ("message", [{"type": "text", "text": "Hello"}])
        prompt_tokens = fake_engine.requests[-1].prompt_tokens
        prompt = tokenizer.decode(prompt_tokens)
        assert "user" not in prompt
        assert prompt.endswith("assistant\n")
        assert ("system\nBe brief." in prompt) == (system is not None)
        counted = await client.post(
            PATH + "/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"}
        )
        assert await counted.get_json() == {"input_tokens": len(prompt_tokens)}


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


class TestAgentRequestShapes:
    """What coding agents send: accepted, and meaning what it means upstream."""

    async def prompt(self, app, fake_engine: FakeEngine, tokenizer, body: dict[str, object]) -> str:
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 200, await response.get_json()
        return tokenizer.decode(fake_engine.requests[-1].prompt_tokens)

    async def test_claude_code_request_fields(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """A system turn inside messages, adaptive thinking, effort, context_management, JSON user_id."""
        body = message(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Fix calc.py"}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /repo"}]},
            ],
            thinking={"type": "adaptive", "display": "omitted"},
            output_config={"effort": "high"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        )
        prompt = await self.prompt(app, fake_engine, tokenizer, body)
        assert (
            "<|im_start|>user\nFix calc.py<|im_end|>\n<|im_start|>system\n# Environment\ncwd: /repo" in prompt
        )

    @pytest.mark.parametrize(
        "fields",
        [
            {"thinking": {"type": "some_future_mode"}},
            {"output_config": {"effort": "ultra"}},
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1}}]}},
            {"metadata": {"user_id": {"nested": True}, "other": 1}},
        ],
    )  # fmt: skip
    async def test_newer_values_are_not_a_400(self, app, fields) -> None:
        """Values newer than Bubo keep the defaults instead of failing the session."""
        response = await app.test_client().post(PATH, json=message(**fields))
        assert response.status_code == 200

    async def test_unknown_and_newer_blocks_are_read_as_text(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """search_result, server_tool_use, a text document and a block type from the future become text."""
        body = message(
            messages=[
                {"role": "user", "content": [
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "DOC BODY"}, "title": "notes.txt"},
                    {"type": "text", "text": "Search it"},
                ]},
                {"role": "assistant", "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "bubo"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"type": "web_search_result", "title": "Owls", "url": "u"}]},
                    {"type": "tool_use", "id": "toolu_1", "name": "find", "input": {"q": "owl"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                        {"type": "search_result", "source": "https://owls.example", "title": "Owl facts", "content": [{"type": "text", "text": "Owls hoot."}]},
                        {"type": "brand_new_block", "text": "FUTURE TEXT"},
                    ]},
                ]},
            ],
        )  # fmt: skip
        prompt = await self.prompt(app, fake_engine, tokenizer, body)
        assert "notes.txt\nDOC BODY" in prompt
        assert '[server_tool_use web_search: {"query": "bubo"}]' in prompt
        assert "Owl facts (https://owls.example)\nOwls hoot." in prompt
        assert "FUTURE TEXT" in prompt
        assert "opaque" not in prompt

    async def test_deferred_tools_load_where_a_tool_reference_names_them(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """defer_loading tools are not offered up front; a tool_reference shows the tool's definition there."""
        tools = [
            {"name": "ToolSearch", "input_schema": {"type": "object"}},
            {
                "name": "CronCreate",
                "description": "Schedule a job",
                "input_schema": {"type": "object"},
                "defer_loading": True,
            },
        ]
        first = message(tools=tools)
        prompt = await self.prompt(app, fake_engine, tokenizer, first)
        assert "ToolSearch" in prompt
        assert "CronCreate" not in prompt
        later = message(
            tools=tools,
            messages=[
                {"role": "user", "content": "Schedule it"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "cron"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "CronCreate"}]}]},
            ],
        )  # fmt: skip
        prompt = await self.prompt(app, fake_engine, tokenizer, later)
        assert prompt.index("ToolSearch") < prompt.index(
            'Tool CronCreate is now available:\n{"name": "CronCreate"'
        )

    async def test_clear_thinking_keeps_the_last_turns(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """clear_thinking_20251015 with thinking_turns 1 drops the thinking of every assistant turn but the last."""

        def turn(text: str) -> dict[str, object]:
            return {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"thought {text}", "signature": ""},
                    {"type": "text", "text": text},
                ],
            }

        body = message(
            messages=[{"role": "user", "content": "a"}, turn("one"), {"role": "user", "content": "b"}, turn("two"), {"role": "user", "content": "c"}],
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]},
        )  # fmt: skip
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 200
        # what the template received: only the last assistant turn kept its reasoning
        request = translate.messages_request(structure(make_converter(), body, wire.MessagesRequest))
        assert [m.reasoning for m in request.prompt.messages if m.role == "assistant"] == [
            None,
            "thought two",
        ]

    async def test_clear_thinking_keep_must_be_all_or_turns(self, app) -> None:
        """A keep that is neither "all" nor thinking_turns is a 400 naming it."""
        body = message(
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "x"}}]}
        )
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 400
        assert (await response.get_json())["error"]["message"].startswith("keep must be")


class TestContentATextModelCannotRead:
    IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    PDF = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
    }

    async def test_images_in_tool_results_and_earlier_turns_become_placeholders(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """A screenshot a tool returned, or one from an earlier turn, is read as a placeholder; the header counts them."""
        body = message(
            messages=[
                {"role": "user", "content": [self.IMAGE, self.PDF, {"type": "text", "text": "What is this?"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [self.IMAGE]}, {"type": "text", "text": "And this?"}]},
            ],
        )  # fmt: skip
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 200
        assert response.headers["Bubo-Omitted-Content"] == "document=1, image=2"
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert prompt.count("[image omitted: this model reads text only]") == 2
        assert "[document omitted: this model reads text only]\nWhat is this?" in prompt

    async def test_count_tokens_counts_the_placeholders(self, app) -> None:
        """count_tokens reads the same placeholder text that generation renders."""
        turns = [
            {"role": "user", "content": "Look"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}],
            },
        ]
        with_image = [
            *turns,
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [self.IMAGE]}],
            },
        ]
        as_text = [
            *turns,
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "[image omitted: this model reads text only]",
                    }
                ],
            },
        ]
        client = app.test_client()
        counts = [
            (await (await client.post(PATH + "/count_tokens", json={"model": "bubo", "messages": m})).get_json())["input_tokens"]
            for m in (with_image, as_text)
        ]  # fmt: skip
        assert counts[0] == counts[1]

    @pytest.mark.parametrize("block", [IMAGE, PDF])
    async def test_an_image_the_user_just_sent_is_a_400(self, app, block) -> None:
        """Only content in the newest user turn, typed by the user, is refused: the user can act on that."""
        body = message(
            messages=[{"role": "user", "content": [block, {"type": "text", "text": "What is this?"}]}]
        )
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert error["code"] == "unsupported_content"
        assert "text only" in error["message"]
