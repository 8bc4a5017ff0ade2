"""What a client reads, whole or streamed: finish reasons after a cut, output order, whole characters, usage.

The fake engine replays scripted replies (``script.pieces`` splits a character
across tokens); each result is read the way a client reads it, and a streamed
result must say the same as the whole one.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from dirty_equals import IsStr

from bubo.engine.fake import FakeScript

from .._asgi import post_stream
from .._sse import payloads as sse_data

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'  # 7 fake tokens
CALL_TOKENS = 7
QUESTION = "Weather in Paris?"
OWL = "\N{OWL}".encode()  # four bytes


def without_ids(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in value.items() if k not in ("id", "call_id")} for value in values]


async def post(app, path: str, body: dict[str, Any], *, stream: bool) -> Any:
    """The JSON body, or the SSE payloads of the streamed response."""
    if stream:
        return sse_data(await post_stream(app.app, path, {**body, "stream": True}))
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 200
    return await response.get_json()


# ---- each dialect read as its SDK reads it --------------------------------------------------


async def chat(app, body: dict[str, Any], *, stream: bool) -> tuple[str, str, list[tuple[str, str]]]:
    """(finish_reason, content, [(name, arguments)])."""
    result = await post(app, "/v1/chat/completions", {"model": "bubo", **body}, stream=stream)
    if not stream:
        choice = result["choices"][0]
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in choice["message"].get("tool_calls") or []
        ]
        return choice["finish_reason"], choice["message"]["content"] or "", calls
    content, calls, finish = [], {}, []
    for chunk in result:
        for choice in chunk["choices"]:
            content.append(choice["delta"].get("content") or "")
            for call in choice["delta"].get("tool_calls") or []:
                name, arguments = calls.get(call["index"], ("", ""))
                calls[call["index"]] = (name + (call["function"].get("name") or ""),
                                        arguments + (call["function"].get("arguments") or ""))  # fmt: skip
            finish.append(choice["finish_reason"])
    assert all(reason is None for reason in finish[:-1])
    return finish[-1], "".join(content), [calls[i] for i in sorted(calls)]


async def messages(app, body: dict[str, Any], *, stream: bool) -> tuple[str, list[dict[str, Any]]]:
    """(stop_reason, content blocks), a stream reassembled as the anthropic SDK does."""
    result = await post(app, "/v1/messages", {"model": "bubo", **body}, stream=stream)
    if stream:
        message = None
        buffers: dict[int, bytes] = {}
        for event in result:
            message = accumulate_event(event=event, current_snapshot=message, json_bufs=buffers)  # type: ignore[arg-type]
        assert message is not None
        result = message.to_dict()
    return result["stop_reason"], without_ids(result["content"])


async def responses(app, body: dict[str, Any], *, stream: bool) -> tuple[str, list[dict[str, Any]]]:
    """(status, output items); a stream's are those of its final event."""
    result = await post(app, "/v1/responses", {"model": "bubo", **body}, stream=stream)
    if stream:
        assert result[-1]["type"] in ("response.completed", "response.incomplete")
        result = result[-1]["response"]
    return result["status"], without_ids(result["output"])


def tools(kind: str) -> list[dict[str, Any]]:
    if kind == "chat":
        return [{"type": "function", "function": WEATHER}]
    if kind == "messages":
        return [{"name": WEATHER["name"], "input_schema": WEATHER["parameters"]}]
    return [{"type": "function", **WEATHER}]


@pytest.fixture(params=[False, True], ids=["whole", "streamed"], name="stream")
def _stream(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


class TestTruncationWinsOverCalls:
    """A limit that cuts the output after a parsed call: the result says so; the call is still returned."""

    REPLY = CALL + "\nAnd then more words"  # the limit cuts after the call and "And"

    async def test_chat_finish_reason_is_length(self, app, script: FakeScript, stream: bool) -> None:
        """finish_reason length, not tool_calls; the call and the text before the cut are there."""
        script.reply = self.REPLY
        body = {"messages": [{"role": "user", "content": QUESTION}], "tools": tools("chat"),
                "max_tokens": CALL_TOKENS + 1}  # fmt: skip
        assert await chat(app, body, stream=stream) == (
            "length",
            "And",
            [("get_weather", '{"city":"Paris"}')],
        )

    async def test_messages_stop_reason_is_max_tokens(self, app, script: FakeScript, stream: bool) -> None:
        """stop_reason max_tokens, not tool_use."""
        script.reply = self.REPLY
        body = {"messages": [{"role": "user", "content": QUESTION}], "tools": tools("messages"),
                "max_tokens": CALL_TOKENS + 1}  # fmt: skip
        assert await messages(app, body, stream=stream) == (
            "max_tokens",
            [
                {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "text", "text": "And"},
            ],
        )

    async def test_responses_is_incomplete(self, app, script: FakeScript, stream: bool) -> None:
        """status incomplete; the call item, then the cut message, itself incomplete."""
        script.reply = self.REPLY
        body = {"input": QUESTION, "tools": tools("responses"), "max_output_tokens": CALL_TOKENS + 1}
        status, items = await responses(app, body, stream=stream)
        assert status == "incomplete"
        assert [(item["type"], item["status"]) for item in items] == [
            ("function_call", "completed"),
            ("message", "incomplete"),
        ]
        assert items[1]["content"][0]["text"] == "And"

    async def test_a_call_that_ends_the_turn_is_still_a_call(
        self, app, script: FakeScript, stream: bool
    ) -> None:
        """Without a cut, a call is tool_calls / tool_use / completed as before."""
        script.reply = CALL
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 64}
        assert (await chat(app, {**body, "tools": tools("chat")}, stream=stream))[0] == "tool_calls"
        assert (await messages(app, {**body, "tools": tools("messages")}, stream=stream))[0] == "tool_use"
        status, _ = await responses(app, {"input": QUESTION, "tools": tools("responses")}, stream=stream)
        assert status == "completed"


class TestGenerationOrder:
    """Text, a call, more text: the blocks and items come in the order the model wrote them."""

    REPLY = "Let me look.\n" + CALL + "\nIt is sunny."

    async def test_messages_blocks(self, app, script: FakeScript, stream: bool) -> None:
        """text, tool_use, text: streamed and whole alike."""
        script.reply = self.REPLY
        body = {
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": tools("messages"),
            "max_tokens": 64,
        }
        assert await messages(app, body, stream=stream) == (
            "tool_use",
            [
                {"type": "text", "text": "Let me look.\n"},
                {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "text", "text": "It is sunny."},
            ],
        )

    async def test_responses_items(self, app, script: FakeScript, stream: bool) -> None:
        """message, function_call, message: streamed and whole alike."""
        script.reply = CALL + "\nIt is sunny."
        status, items = await responses(app, {"input": QUESTION, "tools": tools("responses")}, stream=stream)
        assert status == "completed"
        assert items == [
            {"type": "function_call", "name": "get_weather", "arguments": '{"city":"Paris"}', "status": "completed"},
            {"type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "It is sunny.", "annotations": [], "logprobs": []}]},
        ]  # fmt: skip

    async def test_a_cut_message_is_incomplete(self, app, script: FakeScript, stream: bool) -> None:
        """The message a limit cut has status incomplete (with its text), streamed or not."""
        script.reply = "one two three"
        status, items = await responses(app, {"input": "Count", "max_output_tokens": 2}, stream=stream)
        assert status == "incomplete"
        assert [(item["type"], item["status"]) for item in items] == [("message", "incomplete")]
        assert items[0]["content"][0]["text"] == "one two"


async def answer_text(app, dialect: str, limit: int | None, *, stream: bool) -> str:
    """The text a client reads from each dialect."""
    if dialect == "chat":
        body = {"messages": [{"role": "user", "content": "Draw an owl"}], "max_tokens": limit}
        return (await chat(app, body, stream=stream))[1]
    if dialect == "messages":
        body = {"messages": [{"role": "user", "content": "Draw an owl"}], "max_tokens": limit or 64}
        _, blocks = await messages(app, body, stream=stream)
        return "".join(block["text"] for block in blocks if block["type"] == "text")
    if dialect == "responses":
        _, items = await responses(app, {"input": "Draw an owl", "max_output_tokens": limit}, stream=stream)
        return "".join(
            part["text"] for item in items if item["type"] == "message" for part in item["content"]
        )
    if dialect == "completions":
        body = {"model": "bubo", "prompt": "Owl:", "max_tokens": limit}
        result = await post(app, "/v1/completions", body, stream=stream)
        chunks = result if stream else [result]
        return "".join(choice["text"] for chunk in chunks for choice in chunk["choices"])
    result = await post(app, "/completion", {"prompt": "Owl:", "n_predict": limit or -1}, stream=stream)
    chunks = result if stream else [result]
    return "".join(chunk["content"] for chunk in chunks)


DIALECTS = ["chat", "messages", "responses", "completions", "llama-server"]


class TestWholeCharacters:
    """A character split across tokens is never cut into a replacement character."""

    @pytest.mark.parametrize("dialect", DIALECTS)
    async def test_a_limit_inside_a_character_finishes_it(
        self, app, script: FakeScript, dialect: str, stream: bool
    ) -> None:
        """The limit falls on the owl's first byte: the tokens that finish it follow, the rest does not."""
        script.pieces = (b"Owl: ", OWL[:1], OWL[1:3], OWL[3:], b" and more")
        assert await answer_text(app, dialect, 2, stream=stream) == "Owl: \N{OWL}"

    @pytest.mark.parametrize("dialect", DIALECTS)
    async def test_an_end_inside_a_character_drops_it(
        self, app, script: FakeScript, dialect: str, stream: bool
    ) -> None:
        """The model stopped after half a character: the text ends before it, not with U+FFFD."""
        script.pieces = (b"Owl: ", OWL[:2])
        assert await answer_text(app, dialect, None, stream=stream) == "Owl: "

    async def test_usage_counts_the_tokens_that_finished_it(self, app, script: FakeScript) -> None:
        """Finishing the character may exceed max_tokens by up to three tokens; usage says so."""
        script.pieces = (b"Owl: ", OWL[:1], OWL[1:2], OWL[2:3], OWL[3:], b" and more")
        body = {"model": "bubo", "prompt": "Owl:", "max_tokens": 2}
        result = await post(app, "/v1/completions", body, stream=False)
        assert (result["choices"][0]["text"], result["choices"][0]["finish_reason"]) == (
            "Owl: \N{OWL}",
            "length",
        )
        assert result["usage"]["completion_tokens"] == 5


class TestCompletionsStream:
    BODY = {"model": "bubo", "prompt": "Count:", "stream": True}

    async def test_include_usage_adds_a_chunk_without_choices(self, app, script: FakeScript) -> None:
        """As for chat: the finish reason on a chunk with choices, then usage alone with choices []."""
        script.reply = "one two"
        body = {**self.BODY, "stream_options": {"include_usage": True}}
        chunks = sse_data(await post_stream(app.app, "/v1/completions", body))
        finish, last = chunks[-2], chunks[-1]
        assert finish["choices"][0]["finish_reason"] == "stop"
        assert "usage" not in finish
        assert last["choices"] == []
        assert last["usage"]["completion_tokens"] == 2
        assert all("usage" not in chunk for chunk in chunks[:-1])
        assert [chunk["id"] for chunk in chunks] == [IsStr(regex=r"cmpl-[0-9a-f]{32}")] * len(chunks)

    async def test_without_include_usage_the_finish_chunk_carries_it(self, app, script: FakeScript) -> None:
        """llama-server's shape: the last chunk has the finish reason and the usage."""
        script.reply = "one two"
        chunks = sse_data(await post_stream(app.app, "/v1/completions", self.BODY))
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["usage"]["completion_tokens"] == 2
