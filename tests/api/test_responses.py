"""POST /v1/responses, stored responses and continuations, over the fake engine."""

from __future__ import annotations

import json
import socket
import tracemalloc
import typing
from typing import Any

import httpx
import openai
import pytest
from dirty_equals import IsInt, IsStr

from bubo.api.responses import wire
from bubo.api.responses.stream import ResponseStream
from bubo.domain.generation import GenerationStats, StopCause
from bubo.domain.messages import Message, ToolCall
from bubo.domain.output import Done, ReasoningDelta, ToolCallArgumentsDelta, ToolCallStart
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.service.response_store import ResponseStore, StoredResponse

from .._asgi import post_stream
from .._sse import named

PATH = "/v1/responses"
WEATHER = {
    "type": "function",
    "name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def sent_by_sdk(**request: Any) -> dict[str, Any]:
    """The JSON body the official openai SDK sends for ``client.responses.create(**request)``."""
    sent: list[dict[str, Any]] = []

    def capture(http_request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(http_request.content))
        return httpx.Response(400, json={"error": {"message": "captured", "type": "invalid_request_error"}})

    transport = httpx.MockTransport(capture)
    with (
        httpx.Client(transport=transport) as http,
        openai.OpenAI(
            api_key="unused", base_url="http://bubo.test/v1", max_retries=0, http_client=http
        ) as sdk,
        pytest.raises(openai.BadRequestError),
    ):
        sdk.responses.create(**request)
    return sent[0]


def events(raw: bytes) -> list[dict]:
    """Each event's payload, whose ``type`` is the event's name."""
    out = []
    for name, payload in named(raw):
        assert payload["type"] == name
        out.append(payload)
    return out


class TestCreate:
    async def test_response_shape(self, app, script: FakeScript) -> None:
        """A completed response with a message item holding output_text, and usage."""
        script.reply = "Hi there"
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "input": "Say hi", "max_output_tokens": 32}
        )
        assert response.status_code == 200
        body = await response.get_json()
        assert body["id"] == IsStr(regex=r"resp_[0-9a-f]{32}")
        assert (body["object"], body["status"], body["incomplete_details"], body["error"]) == (
            "response",
            "completed",
            None,
            None,
        )
        assert body["output"] == [
            {
                "type": "message", "id": IsStr(regex=r"msg_[0-9a-f]{32}"), "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi there", "annotations": [], "logprobs": []}],
            }
        ]  # fmt: skip
        assert body["usage"] == {
            "input_tokens": IsInt, "input_tokens_details": {"cached_tokens": 0, "shared_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": IsInt,
        }  # fmt: skip
        assert body["max_output_tokens"] == 32
        assert (body["store"], body["parallel_tool_calls"], body["tool_choice"]) == (True, True, "auto")

    async def test_max_output_tokens_is_incomplete(self, app, script: FakeScript) -> None:
        """Running into max_output_tokens gives status incomplete with its reason."""
        script.reply = "one two three"
        body = await (
            await app.test_client().post(PATH, json={"model": "bubo", "input": "x", "max_output_tokens": 1})
        ).get_json()
        assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})

    async def test_items_reach_the_template(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """Instructions, messages, calls and their outputs, and reasoning are rendered in order."""
        items = [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "call it"}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
            {"role": "user", "content": "Thanks"},
        ]
        tools = [
            {"type": "function", "name": "weather", "parameters": {"type": "object"}},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch"},
        ]
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "instructions": "Be brief.", "input": items, "tools": tools}
        )
        assert response.status_code == 200
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        order = [
            "system\nBe brief.",
            "system\nUse tools.",
            "user\nWeather?",
            "tool\nSunny",
            "It is sunny.",
            "user\nThanks",
        ]
        positions = [prompt.index(fragment) for fragment in order]
        assert positions == sorted(positions)

    @pytest.mark.parametrize(
        ("body", "code", "param"),
        [
            ({"model": "bubo"}, "missing_input", "input"),
            ({"model": "bubo", "input": [{"type": 7}]}, "parse_error", "input[0].type"),
            ({"model": "bubo", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "unsupported_content", "input[0].content[0]"),
            ({"model": "bubo", "input": [{"type": "function_call", "name": "f"}]}, "parse_error", "input[0].call_id"),
            ({"model": "bubo", "input": "x", "tools": [{"type": "function"}]}, "parse_error", "tools[0].name"),
            ({"model": "bubo", "input": "x", "max_output_tokens": 0}, "invalid_request", "max_output_tokens"),
            ({"input": "x"}, "missing_model", "model"),
        ],
    )  # fmt: skip
    async def test_errors(self, app, body, code, param) -> None:
        """Bad requests are 400s naming the field."""
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == (code, param)


class TestInputItems:
    """Input items are structured by the converter: a union tagged by type, a message's type optional."""

    CALL: typing.ClassVar = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"}
    USER: typing.ClassVar = {"role": "user", "content": "Weather?"}

    async def test_newer_item_types_are_skipped(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """An item type Bubo does not know (a hosted tool's call) is skipped, not a 400 for the session."""
        items = [self.USER, {"type": "computer_call", "call_id": "c2", "action": {"type": "click"}}]
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": items})
        assert response.status_code == 200
        assert "computer_call" not in tokenizer.decode(fake_engine.requests[-1].prompt_tokens)

    @pytest.mark.parametrize(
        ("item", "message"),
        [
            ({"type": "function_call_output", "call_id": 7, "output": "Sunny"},
             "expected a string, got integer @ $.input[3].call_id"),
            ({"type": "function_call_output", "call_id": "c1", "output": {"text": "Sunny"}},
             "expected a string or an array, got object @ $.input[3].output"),
            ({"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": 1}]},
             "expected a string, got integer @ $.input[3].output[0].text"),
            ({"role": "user", "content": [{"type": "input_text", "text": ["a"]}]},
             "expected a string, got array @ $.input[3].content[0].text"),
            ({"role": "user", "content": "a", "type": "message", "status": 1},
             "expected a string or null, got integer @ $.input[3].status"),
            ({"role": "robot", "content": "a"},
             'expected one of "user", "assistant", "system", "developer", got "robot" @ $.input[3].role'),
            ({"type": "reasoning", "summary": "thinking"},
             "expected an array or null, got string @ $.input[3].summary"),
            ({"type": "reasoning", "content": [{"type": "summary_text", "text": False}]},
             "expected a string, got boolean @ $.input[3].content[0].text"),
            ({"type": "function_call", "call_id": "c2", "name": "f", "arguments": {"a": 1}},
             "expected a string, got object @ $.input[3].arguments"),
            ({"content": "no role"}, "required field missing @ $.input[3].role"),
            ("Thanks", "expected an object, got string @ $.input[3]"),
        ],
    )  # fmt: skip
    async def test_a_wrong_value_in_an_item_names_its_path(self, app, item: object, message: str) -> None:
        """A value of the wrong JSON type anywhere in an item is a 400 whose param is its JSON path."""
        items = [
            self.USER,
            self.CALL,
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            item,
        ]
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": items})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["message"]) == ("parse_error", message)
        assert error["param"] == message.rpartition(" @ $.")[2]

    async def test_every_bad_item_is_reported(self, app) -> None:
        """Each bad field of each item is in the message; param is the first."""
        items = [{"role": "user"}, self.CALL, {"type": "function_call", "name": 5}]
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": items, "top_p": "x"})
        error = (await response.get_json())["error"]
        assert error["param"] == "input[0].content"
        assert error["message"].split("; ") == [
            "required field missing @ $.input[0].content",
            "required field missing @ $.input[2].call_id",
            "expected a string, got integer @ $.input[2].name",
            "required field missing @ $.input[2].arguments",
            "expected a number or null, got string @ $.top_p",
        ]

    @pytest.mark.parametrize(
        "item", [{"role": "user", "content": "Hi"}, {"type": None, "role": "user", "content": "Hi"}]
    )
    async def test_a_message_may_omit_its_type(self, app, fake_engine: FakeEngine, tokenizer, item) -> None:
        """An item without type (or with type null) is a message."""
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": [item]})
        assert response.status_code == 200
        assert "user\nHi" in tokenizer.decode(fake_engine.requests[-1].prompt_tokens)

    async def test_an_item_reference_is_refused_by_name(self, app) -> None:
        """Bubo keeps no items by id: a reference is a 400 at its id that says what to send instead."""
        items = [self.USER, {"type": "item_reference", "id": "msg_1"}]
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": items})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("invalid_request", "input[1].id")
        assert "previous_response_id" in error["message"]

    async def test_what_the_openai_sdk_sends_back_is_accepted(
        self, thinking_app, script: FakeScript, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """An agent's next turn through the official SDK: the earlier output items as the SDK holds them
        (reasoning, function_call), the call's output, and messages of each shape, accepted and rendered in order.
        """
        client = thinking_app.test_client()
        script.reply = '<think>Look it up.</think><tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        first = await client.post(
            PATH, json={"model": "bubo", "input": "Weather in Oslo?", "tools": [WEATHER]}
        )
        output = openai.types.responses.Response.model_validate(await first.get_json()).output
        assert [item.type for item in output] == ["reasoning", "function_call"]
        call_id = output[1].call_id  # type: ignore[union-attr]
        body = sent_by_sdk(
            model="bubo",
            tools=[WEATHER],
            input=[
                {"role": "user", "content": "Weather in Oslo?"},
                *output,
                {"type": "function_call_output", "call_id": call_id, "output": "Sunny, 21 C"},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks!"}]},
            ],
        )  # fmt: skip
        script.reply = "You are welcome."
        response = await client.post(PATH, json=body)
        assert response.status_code == 200, await response.get_json()
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        order = ["Weather in Oslo?", '"city": "Oslo"', "Sunny, 21 C", "It is sunny.", "Thanks!"]
        positions = [prompt.index(fragment) for fragment in order]
        assert positions == sorted(positions)


class TestStreaming:
    async def test_event_sequence(self, app, script: FakeScript) -> None:
        """created, in_progress, the message item's events, completed; sequence numbers count up."""
        script.reply = "Hi there"
        stream = events(
            await post_stream(app.app, PATH, {"model": "bubo", "input": "Say hi", "stream": True})
        )
        assert [e["type"] for e in stream] == [
            "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
            "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
            "response.content_part.done", "response.output_item.done", "response.completed",
        ]  # fmt: skip
        assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
        assert stream[0]["response"]["status"] == "in_progress"
        assert stream[6]["text"] == "Hi there"
        final = stream[-1]["response"]
        assert final["status"] == "completed"
        assert final["output"][0]["content"][0]["text"] == "Hi there"
        assert final["output"][0]["id"] == stream[2]["item"]["id"]

    def test_reasoning_and_function_call_items(self) -> None:
        """Reasoning text and function-call arguments stream as their own items."""
        stored: list[tuple[wire.Response, object]] = []
        body = wire.ResponsesRequest(model="bubo", input="x")
        encoder = ResponseStream(
            body,
            response_id="resp_1",
            created_at=0,
            model="bubo",
            on_finished=lambda r, m: stored.append((r, m)),
        )
        done = Done(
            finish_reason="tool_calls",
            cause=StopCause.EOS,
            stats=GenerationStats(prompt_tokens=5, completion_tokens=7),
            reasoning_tokens=2,
        )
        output = [
            ReasoningDelta(text="think"), ToolCallStart(index=0, id="call_1", name="weather"),
            ToolCallArgumentsDelta(index=0, fragment='{"a":'), ToolCallArgumentsDelta(index=0, fragment="1}"), done,
        ]  # fmt: skip
        stream = events(b"".join([*encoder.opening(), *(f for e in output for f in encoder.encode(e))]))
        assert [e["type"] for e in stream] == [
            "response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
            "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "response.completed",
        ]  # fmt: skip
        assert stream[11]["arguments"] == '{"a":1}'
        final = stream[-1]["response"]
        assert [item["type"] for item in final["output"]] == ["reasoning", "function_call"]
        assert final["output"][1] == {
            "type": "function_call", "id": IsStr(regex="fc_[0-9a-f]{32}"), "call_id": "call_1", "name": "weather",
            "arguments": '{"a":1}', "status": "completed",
        }  # fmt: skip
        assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
        _, assistant = stored[0]
        assert assistant.reasoning == "think"
        assert assistant.tool_calls[0].arguments == '{"a":1}'

    async def test_a_reasoning_only_answer_has_the_same_items_streamed_or_not(
        self, thinking_app, script: FakeScript
    ) -> None:
        """Reasoning and no answer: a reasoning item and an empty message, whichever way it is delivered."""
        script.reply = "<think>Nothing to add.</think>"
        body = {"model": "bubo", "input": "Hmm?", "max_output_tokens": 32}
        whole = await (await thinking_app.test_client().post(PATH, json=body)).get_json()
        streamed = events(await post_stream(thinking_app.app, PATH, {**body, "stream": True}))[-1]["response"]
        for response in (whole, streamed):
            assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
            assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Nothing to add."}]
            assert response["output"][1]["content"] == [
                {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ]


class TestStore:
    async def test_continuation_by_previous_response_id(
        self, app, script: FakeScript, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """A continuation renders the stored conversation, the stored answer, then the new input."""
        client = app.test_client()
        script.reply = "Paris."
        first = await (
            await client.post(
                PATH, json={"model": "bubo", "instructions": "Be brief.", "input": "Capital of France?"}
            )
        ).get_json()
        script.reply = "About two million."
        second = await client.post(
            PATH, json={"model": "bubo", "input": "How many people?", "previous_response_id": first["id"]}
        )
        assert second.status_code == 200
        assert (await second.get_json())["previous_response_id"] == first["id"]
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert "Be brief." not in prompt  # instructions do not carry over
        assert prompt.index("Capital of France?") < prompt.index("Paris.") < prompt.index("How many people?")

    async def test_retrieve_and_delete(self, app) -> None:
        """GET returns the stored response; DELETE forgets it; then both are 404."""
        client = app.test_client()
        created = await (await client.post(PATH, json={"model": "bubo", "input": "x"})).get_json()
        fetched = await (await client.get(f"{PATH}/{created['id']}")).get_json()
        assert fetched == created
        deleted = await (await client.delete(f"{PATH}/{created['id']}")).get_json()
        assert deleted == {"id": created["id"], "object": "response", "deleted": True}
        for method in (client.get, client.delete):
            response = await method(f"{PATH}/{created['id']}")
            assert response.status_code == 404
            assert (await response.get_json())["error"]["code"] == "response_not_found"

    async def test_store_false_is_not_kept(self, app) -> None:
        """store: false responses cannot be continued."""
        client = app.test_client()
        created = await (
            await client.post(PATH, json={"model": "bubo", "input": "x", "store": False})
        ).get_json()
        response = await client.post(
            PATH, json={"model": "bubo", "input": "y", "previous_response_id": created["id"]}
        )
        assert response.status_code == 404
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("response_not_found", "previous_response_id")

    async def test_an_id_another_replica_stored_is_a_404_that_names_this_one_and_the_way_on(
        self, app
    ) -> None:
        """Behind a gateway a continuation may reach a replica that never saw the id: the 404 says which
        server answered and what to send instead; sending the earlier turns as input items then works."""
        client = app.test_client()
        response = await client.post(
            PATH, json={"model": "bubo", "input": "and then?", "previous_response_id": "resp_elsewhere"}
        )
        assert response.status_code == 404
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("response_not_found", "previous_response_id")
        assert f"not stored on this server ({socket.gethostname()}, " in error["message"]
        assert "stored by another replica" in error["message"]
        assert error["message"].endswith("send the earlier turns as input items instead")
        earlier = [
            {"role": "user", "content": "Say hi."},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
        ]
        again = await client.post(
            PATH, json={"model": "bubo", "input": [*earlier, {"role": "user", "content": "and then?"}]}
        )
        assert again.status_code == 200

    async def test_streamed_responses_are_stored(self, app) -> None:
        """A streamed response is stored when it completes."""
        client = app.test_client()
        raw = await post_stream(app.app, PATH, {"model": "bubo", "input": "x", "stream": True})
        response_id = events(raw)[-1]["response"]["id"]
        assert (await client.get(f"{PATH}/{response_id}")).status_code == 200


class TestLlamaTelemetry:
    """llama-server's ``return_progress`` and ``timings_per_token`` on a Responses stream."""

    async def test_progress_rides_on_in_progress_and_timings_on_every_delta(
        self, app, script: FakeScript
    ) -> None:
        script.reply = "Hi there"
        body = {"input": "x " * 20, "stream": True, "return_progress": True, "timings_per_token": True}
        frames = events(await post_stream(app.app, PATH, {"model": "bubo", **body}))
        progress = [f for f in frames if "prompt_progress" in f]
        assert progress
        assert {f["type"] for f in progress} == {"response.in_progress"}
        assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"] > 0
        assert all(f["response"]["status"] == "in_progress" for f in progress)
        deltas = [f for f in frames if f["type"] == "response.output_text.delta"]
        assert deltas
        assert all({"prompt_per_second", "predicted_per_second"} <= f["timings"].keys() for f in deltas)
        assert [f["timings"]["predicted_n"] for f in deltas] == sorted(
            f["timings"]["predicted_n"] for f in deltas
        )
        assert frames[-1]["type"] == "response.completed"
        assert frames[-1]["timings"]["predicted_n"] == frames[-1]["response"]["usage"]["output_tokens"]

    async def test_without_them_only_the_last_event_has_timings(self, app, script: FakeScript) -> None:
        script.reply = "Hi there"
        frames = events(await post_stream(app.app, PATH, {"model": "bubo", "input": "x", "stream": True}))
        assert [f["type"] for f in frames if "timings" in f or "prompt_progress" in f] == [
            "response.completed"
        ]


class TestResponseStore:
    def entry(self, size: int) -> StoredResponse:
        return StoredResponse(body=b"x" * size, conversation=())

    def test_lru_by_count(self) -> None:
        """Past max_entries the least recently used entry goes."""
        store = ResponseStore(max_entries=2, max_bytes=10**6)
        store.put("a", self.entry(1))
        store.put("b", self.entry(1))
        assert store.get("a") is not None  # a is now the most recent
        store.put("c", self.entry(1))
        assert store.get("a") is not None
        assert store.get("b") is None
        assert store.get("c") is not None
        assert store.evictions == 1

    def test_lru_by_bytes(self) -> None:
        """Past max_bytes entries go until the budget holds; a too-large entry is not kept."""
        budget = self.entry(100).size * 3 // 2
        store = ResponseStore(max_entries=100, max_bytes=budget)
        store.put("a", self.entry(100))
        store.put("b", self.entry(100))
        assert len(store) == 1
        assert store.get("b") is not None
        store.put("huge", self.entry(budget))
        assert store.get("huge") is None
        assert store.total_bytes <= budget

    def test_the_budget_holds_the_memory_the_entries_really_take(self) -> None:
        """Non-ASCII reasoning and tool calls: what the store counts is at least what it holds, within budget.

        Counting characters undercounted: a CJK character takes two bytes in memory
        (three in the UTF-8 body), so the store grew past its budget.
        """
        budget = 2 * 1024 * 1024
        store = ResponseStore(max_entries=10_000, max_bytes=budget)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for n in range(200):
                thought = f"{n}思考" * 4000
                answer = Message(
                    role="assistant",
                    content="答" * 2000,
                    reasoning=thought,
                    tool_calls=(
                        ToolCall(id=f"call_{n}", name="lookup", arguments='{"q":"' + "検" * 1000 + '"}'),
                    ),
                )
                body = json.dumps({"output": [{"type": "reasoning", "text": thought}]}, ensure_ascii=False)
                store.put(f"resp_{n}", StoredResponse(body=body.encode(), conversation=(answer,)))
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert store.evictions > 0  # the budget was reached
        assert held <= store.total_bytes <= budget

    def test_a_conversation_chain_counts_each_turn_once(self) -> None:
        """Each continuation holds the earlier turns too, but shares their objects: they count once."""
        store = ResponseStore(max_entries=1000, max_bytes=2 * 1024 * 1024)
        conversation: tuple[Message, ...] = ()
        for n in range(50):
            turn = (
                Message(role="user", content=f"question {n}"),
                Message(role="assistant", content="x" * 10_000),
            )
            conversation = (*conversation, *turn)
            store.put(f"resp_{n}", StoredResponse(body=b"{}", conversation=conversation))
        assert (len(store), store.evictions) == (50, 0)
        assert store.total_bytes < 50 * 12_000
        for n in range(50):
            store.delete(f"resp_{n}")
        assert store.total_bytes == 0

    async def test_metrics_show_the_store_size(self, app) -> None:
        """/metrics has the store's bytes, entries and budget."""
        client = app.test_client()
        await client.post(PATH, json={"model": "bubo", "input": "x"})
        text = (await (await client.get("/metrics")).get_data()).decode()
        values = {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.startswith("bubo:responses_store")
        }
        assert values["bubo:responses_store_entries"] == 1
        assert values["bubo:responses_store_bytes"] > 0
        assert values["bubo:responses_store_budget_bytes"] == 64 * 1024 * 1024
        assert values["bubo:responses_store_evictions_total"] == 0


class TestCodexTools:
    """Codex's namespace and custom (freeform) tools."""

    NAMESPACE = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [
            {"type": "function", "name": "spawn_agent", "description": "Spawn one.", "strict": False,
             "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}},
            {"type": "web_search"},
        ],
    }  # fmt: skip
    PATCH_TOOL = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Apply a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
    }
    PATCH = "*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b\n*** End Patch"

    async def test_namespace_functions_are_offered_and_called_under_their_names(
        self, app, script: FakeScript, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """A namespace's functions reach the model with its description; their calls carry the namespace."""
        script.reply = '<tool_call>\n{"name": "spawn_agent", "arguments": {"message": "go"}}\n</tool_call>'
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "input": "Hi", "tools": [self.NAMESPACE]}
        )
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert '"name": "spawn_agent"' in prompt
        assert "(multi_agent_v1: Sub-agents.)" in prompt
        (call,) = (await response.get_json())["output"]
        assert (call["type"], call["name"], call["namespace"]) == (
            "function_call",
            "spawn_agent",
            "multi_agent_v1",
        )

    async def test_a_custom_tool_takes_one_string_and_returns_a_custom_tool_call(
        self, app, script: FakeScript, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """apply_patch is offered as a function of one string; the call is a custom_tool_call with that string."""
        script.reply = (
            "<tool_call>\n"
            + json.dumps({"name": "apply_patch", "arguments": {"input": self.PATCH}})
            + "\n</tool_call>"
        )
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "input": "Fix it", "tools": [self.PATCH_TOOL]}
        )
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert '"name": "apply_patch"' in prompt
        assert '"input": {"type": "string"' in prompt
        (call,) = (await response.get_json())["output"]
        assert (call["type"], call["name"], call["input"]) == ("custom_tool_call", "apply_patch", self.PATCH)
        assert call["call_id"].startswith("call_")

    async def test_a_custom_tool_can_be_forced_by_name(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ) -> None:
        """tool_choice {"type": "custom", "name": …} forces that tool's call, its one string argument by grammar."""
        script.reply = (
            "<tool_call>\n"
            + json.dumps({"name": "apply_patch", "arguments": {"input": self.PATCH}})
            + "\n</tool_call>"
        )
        body = {
            "model": "bubo",
            "input": "Fix it",
            "tools": [self.PATCH_TOOL],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 200
        spec, _ = fake_engine.compiled[-1]
        assert "call ::= call-0\n" in spec.rules  # one call admitted:
        assert '\\"apply_patch\\"' in spec.rules  # apply_patch's,
        assert 'args-0 ::= "{\\x22input\\x22: \\x22" args-0-input "\\x22}"' in spec.rules  # its input
        assert '"*** Begin Patch"' in spec.rules  # in its Lark grammar,
        assert spec.schemas == ()  # not a plain string's schema
        (call,) = (await response.get_json())["output"]
        assert (call["type"], call["input"]) == ("custom_tool_call", self.PATCH)

    async def test_a_grammar_that_cannot_be_enforced_leaves_a_forced_input_unconstrained(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ) -> None:
        """A left-recursive Lark grammar is no 400: the forced call's input is any string."""
        script.reply = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "aa"}}\n</tool_call>'
        tool = {**self.PATCH_TOOL, "format": {"type": "grammar", "syntax": "lark", "definition": 'start: start "a" | "a"'}}  # fmt: skip
        body = {"model": "bubo", "input": "Fix it", "tools": [tool], "tool_choice": {"type": "custom", "name": "apply_patch"}}  # fmt: skip
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 200
        spec, _ = fake_engine.compiled[-1]
        ((rule, schema),) = spec.schemas  # the input is a plain string, by its schema
        assert (rule, schema["properties"]["input"]["type"]) == ("args-0", "string")
        (call,) = (await response.get_json())["output"]
        assert (call["type"], call["input"]) == ("custom_tool_call", "aa")

    async def test_a_custom_tool_call_streams_its_input(self, app, script: FakeScript) -> None:
        """The input arrives as response.custom_tool_call_input.delta events, decoded, then .done."""
        script.reply = (
            "<tool_call>\n"
            + json.dumps({"name": "apply_patch", "arguments": {"input": self.PATCH}})
            + "\n</tool_call>"
        )
        body = {"model": "bubo", "input": "Fix it", "tools": [self.PATCH_TOOL], "stream": True}
        frames = events(await post_stream(app.app, PATH, body))
        deltas = [f["delta"] for f in frames if f["type"] == "response.custom_tool_call_input.delta"]
        assert len(deltas) > 3  # streamed as generated, not in one piece
        assert "".join(deltas) == self.PATCH
        (done,) = [f for f in frames if f["type"] == "response.custom_tool_call_input.done"]
        assert done["input"] == self.PATCH
        added = next(f for f in frames if f["type"] == "response.output_item.added")
        assert added["item"]["type"] == "custom_tool_call"

    async def test_tools_in_an_additional_tools_item(
        self, app, script: FakeScript, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """Codex's known model families get their tools in an additional_tools input item: namespaces of
        function and custom tools; a namespaced custom tool's call carries its namespace."""
        additional = {
            "type": "additional_tools",
            "id": "at_1",
            "role": "developer",
            "tools": [{"type": "namespace", "name": "functions", "description": "", "tools": [
                {"type": "custom", "name": "exec", "description": "Run JavaScript.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"}},
                {"type": "function", "name": "wait", "description": "Wait.", "strict": False, "parameters": {"type": "object", "properties": {}}},
            ]}],
        }  # fmt: skip
        script.reply = (
            "<tool_call>\n"
            + json.dumps({"name": "exec", "arguments": {"input": "await tools.wait()"}})
            + "\n</tool_call>"
        )
        items = [
            additional,
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go"}]},
        ]
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": items})
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert '"name": "exec"' in prompt
        assert '"name": "wait"' in prompt
        (call,) = (await response.get_json())["output"]
        assert (call["type"], call["name"], call["namespace"], call["input"]) == (
            "custom_tool_call",
            "exec",
            "functions",
            "await tools.wait()",
        )

    async def test_a_custom_tool_call_in_history_renders_as_the_model_wrote_it(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """A custom_tool_call and its output go back to the template as a call with {"input": …} and a result."""
        history = [
            {"type": "message", "role": "user", "content": "Fix it"},
            {"type": "custom_tool_call", "call_id": "call_1", "name": "apply_patch", "input": self.PATCH},
            {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"},
        ]
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "input": history, "tools": [self.PATCH_TOOL]}
        )
        assert response.status_code == 200
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert (
            json.dumps({"name": "apply_patch", "arguments": {"input": self.PATCH}}, ensure_ascii=False)
            in prompt
        )
        assert "Done!" in prompt


class TestContentATextModelCannotRead:
    IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}

    async def test_an_image_in_a_function_output_is_a_placeholder(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """view_image's output (an image) is read as a placeholder; the header counts it."""
        history = [
            {"type": "message", "role": "user", "content": "Look at shot.png"},
            {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": [self.IMAGE]},
        ]
        response = await app.test_client().post(PATH, json={"model": "bubo", "input": history})
        assert response.status_code == 200
        assert response.headers["Bubo-Omitted-Content"] == "image=1"
        assert "[image omitted: this model reads text only]" in tokenizer.decode(
            fake_engine.requests[-1].prompt_tokens
        )

    async def test_an_image_the_user_just_sent_is_a_400(self, app) -> None:
        """An image in the newest user message is refused, naming it."""
        content = [{"type": "input_text", "text": "What is it?"}, self.IMAGE]
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "input": [{"role": "user", "content": content}]}
        )
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("unsupported_content", "input[0].content[1]")
