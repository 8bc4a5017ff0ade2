"""Tool calls, structured output and reasoning end to end: real model, official SDKs."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import jsonschema
import openai
import pytest

from .conftest import (
    Server,
    anthropic_client,
    free_port,
    hypercorn_command,
    openai_client,
    serving,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

FIXTURES = Path(__file__).parent.parent / "fixtures"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "Get the weather forecast for a city", "parameters": SCHEMA}
TIME = {"name": "get_time", "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
QUESTION = "What will the weather be in Paris tomorrow?"


@pytest.fixture(name="oai")
def _oai(server: Server) -> Iterator[openai.OpenAI]:
    with openai_client(server) as client:
        yield client


@pytest.fixture(name="claude")
def _claude(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic_client(server) as client:
        yield client


def valid(arguments: object, schema: dict = SCHEMA) -> dict:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, schema)
    assert isinstance(value, dict)
    return value


class TestForcedToolCalls:
    @pytest.mark.parametrize("stream", [False, True])
    def test_chat_required(self, oai: openai.OpenAI, stream: bool) -> None:
        """tool_choice required makes even the tiny model produce a schema-valid call."""
        tools = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
        kwargs = {"model": "bubo", "messages": [{"role": "user", "content": QUESTION}], "tools": tools,
                  "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}  # fmt: skip
        if stream:
            chunks = list(oai.chat.completions.create(**kwargs, stream=True))  # type: ignore[call-overload]
            deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
            first = deltas[0].tool_calls[0]
            assert first.id.startswith("call_")
            name = first.function.name
            arguments = "".join(d.tool_calls[0].function.arguments or "" for d in deltas)
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
        else:
            completion = oai.chat.completions.create(**kwargs)  # type: ignore[call-overload]
            assert completion.choices[0].finish_reason == "tool_calls"
            calls = completion.choices[0].message.tool_calls
            assert len(calls) == 1
            name, arguments = calls[0].function.name, calls[0].function.arguments
        assert name in ("get_weather", "get_time")
        valid(arguments, SCHEMA if name == "get_weather" else TIME["parameters"])

    def test_chat_named(self, oai: openai.OpenAI) -> None:
        """A named choice calls exactly that tool."""
        completion = oai.chat.completions.create(
            model="bubo", messages=[{"role": "user", "content": QUESTION}],
            tools=[{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}],
            tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0,
        )  # fmt: skip
        calls = completion.choices[0].message.tool_calls or []
        assert {c.function.name for c in calls} == {"get_time"}
        for c in calls:
            valid(c.function.arguments, TIME["parameters"])

    @pytest.mark.parametrize("stream", [False, True])
    def test_anthropic_any_and_tool(self, claude: anthropic.Anthropic, stream: bool) -> None:
        """Anthropic any / tool choices give tool_use blocks with schema-valid input."""
        tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": SCHEMA}]
        for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
            kwargs = {"model": "bubo", "max_tokens": 120, "messages": [{"role": "user", "content": QUESTION}],
                      "tools": tools, "tool_choice": choice, "extra_body": {"temperature": 0}}  # fmt: skip
            if stream:
                with claude.messages.stream(**kwargs) as events:  # type: ignore[arg-type]
                    kinds = [e.type for e in events]
                    message = events.get_final_message()
                assert "input_json" in kinds  # the arguments streamed as input_json_delta
            else:
                message = claude.messages.create(**kwargs)  # type: ignore[arg-type]
            assert message.stop_reason == "tool_use"
            uses = [block for block in message.content if block.type == "tool_use"]
            assert uses
            assert uses[0].id.startswith("toolu_")
            assert uses[0].name == "get_weather"
            valid(uses[0].input)

    @pytest.mark.parametrize("stream", [False, True])
    def test_responses_required(self, oai: openai.OpenAI, stream: bool) -> None:
        """Responses tool_choice required gives function_call items with schema-valid arguments."""
        kwargs = {"model": "bubo", "input": QUESTION, "tools": [{"type": "function", **WEATHER}],
                  "tool_choice": "required", "temperature": 0}  # fmt: skip
        if stream:
            events = list(oai.responses.create(**kwargs, stream=True))  # type: ignore[call-overload]
            kinds = [e.type for e in events]
            assert "response.function_call_arguments.delta" in kinds
            assert "response.function_call_arguments.done" in kinds
            response = events[-1].response
        else:
            response = oai.responses.create(**kwargs)  # type: ignore[call-overload]
        calls = [item for item in response.output if item.type == "function_call"]
        assert calls
        assert calls[0].name == "get_weather"
        valid(calls[0].arguments)

    def test_tool_result_round_trip(self, oai: openai.OpenAI) -> None:
        """The tool's result goes back as a tool message and the model answers from it."""
        messages: list = [{"role": "user", "content": QUESTION}]
        first = oai.chat.completions.create(
            model="bubo", messages=messages, tools=[{"type": "function", "function": WEATHER}],
            tool_choice="required", parallel_tool_calls=False, temperature=0,
        )  # fmt: skip
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees celsius."},
        ]
        second = oai.chat.completions.create(
            model="bubo",
            messages=messages,
            tools=[{"type": "function", "function": WEATHER}],
            max_tokens=40,
            temperature=0,
        )
        assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
        assert second.usage is not None
        assert second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


class TestStructuredOutput:
    PERSON = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}},
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    }  # fmt: skip

    def test_chat_json_schema(self, oai: openai.OpenAI) -> None:
        """response_format json_schema output parses and validates."""
        completion = oai.chat.completions.create(
            model="bubo", messages=[{"role": "user", "content": "Describe a person."}], max_tokens=120, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": self.PERSON}},
        )  # fmt: skip
        valid(completion.choices[0].message.content, self.PERSON)

    def test_responses_text_format(self, oai: openai.OpenAI) -> None:
        """Responses text.format json_schema output validates."""
        response = oai.responses.create(
            model="bubo", input="Describe a person.", max_output_tokens=120, temperature=0,
            text={"format": {"type": "json_schema", "name": "person", "schema": self.PERSON}},
        )  # fmt: skip
        valid(response.output_text, self.PERSON)

    def test_anthropic_output_config(self, claude: anthropic.Anthropic) -> None:
        """Anthropic output_config.format output validates."""
        message = claude.messages.create(
            model="bubo", max_tokens=120, messages=[{"role": "user", "content": "Describe a person."}],
            output_config={"format": {"type": "json_schema", "schema": self.PERSON}}, extra_body={"temperature": 0},
        )  # fmt: skip
        valid(message.content[0].text, self.PERSON)  # type: ignore[union-attr]

    ADULT = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 120}},
             "required": ["age"]}  # fmt: skip

    @pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
    def test_integer_bounds_are_enforced(self, oai: openai.OpenAI, seed: int) -> None:
        """Pydantic's Field(ge=18, le=120) is a 200 whose age is in range, even when the question asks for
        one outside it and sampling is free (temperature 1)."""
        completion = oai.chat.completions.create(
            model="bubo", messages=[{"role": "user", "content": "A newborn baby is 0 days old. How old is it?"}],
            max_tokens=40, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "adult", "schema": self.ADULT}},
        )  # fmt: skip
        assert completion.choices[0].finish_reason == "stop"
        valid(completion.choices[0].message.content, self.ADULT)


@pytest.fixture(name="thinking_server", scope="module")
def _thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model behind a Qwen3-style template, forced by a grammar to think first."""
    env = {
        "BUBO_CHAT_TEMPLATE_FILE": str(FIXTURES / "qwen3_style.jinja"),
        "BUBO_GRAMMAR_FILE": str(FIXTURES / "think.gbnf"),
    }
    with serving(
        tmp_path_factory.mktemp("thinking") / "server.log", env=env, command=hypercorn_command
    ) as server:
        yield server


class TestReasoningSplit:
    QUESTION = [{"role": "user", "content": "Say hello to the world."}]

    def test_chat(self, thinking_server: Server, sdk: contextlib.ExitStack) -> None:
        """Chat: reasoning_content and content, streaming and not, agree."""
        client = sdk.enter_context(openai_client(thinking_server))
        completion = client.chat.completions.create(
            model="bubo", messages=self.QUESTION, max_tokens=200, temperature=0
        )
        message = completion.choices[0].message.model_dump()
        assert message["reasoning_content"]
        assert message["content"]
        assert "<think>" not in message["content"]
        assert "</think>" not in message["content"]
        assert completion.usage.completion_tokens_details.reasoning_tokens > 0  # type: ignore[union-attr]
        chunks = list(
            client.chat.completions.create(
                model="bubo", messages=self.QUESTION, max_tokens=200, temperature=0, stream=True
            )
        )
        deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == message["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == message["content"]

    def test_anthropic(self, thinking_server: Server, sdk: contextlib.ExitStack) -> None:
        """Anthropic: a thinking block then a text block, streamed as thinking_delta then text_delta."""
        client = sdk.enter_context(anthropic_client(thinking_server))
        message = client.messages.create(
            model="bubo", max_tokens=200, messages=self.QUESTION, extra_body={"temperature": 0}
        )
        assert [block.type for block in message.content] == ["thinking", "text"]
        with client.messages.stream(
            model="bubo", max_tokens=200, messages=self.QUESTION, extra_body={"temperature": 0}
        ) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
        assert deltas[0] == "thinking_delta"
        assert "text_delta" in deltas
        assert final.content[0].thinking == message.content[0].thinking  # type: ignore[union-attr]

    def test_responses(self, thinking_server: Server, sdk: contextlib.ExitStack) -> None:
        """Responses: a reasoning item then a message item; streamed reasoning_text deltas."""
        client = sdk.enter_context(openai_client(thinking_server))
        response = client.responses.create(
            model="bubo", input="Say hello to the world.", max_output_tokens=200, temperature=0
        )
        assert [item.type for item in response.output] == ["reasoning", "message"]
        events = list(
            client.responses.create(
                model="bubo",
                input="Say hello to the world.",
                max_output_tokens=200,
                temperature=0,
                stream=True,
            )
        )
        kinds = [e.type for e in events]
        assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")


@pytest.fixture(name="open_think_server", scope="module")
def _open_think_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model behind a template whose prompt opens <think>: it reasons until stopped."""
    port = free_port()
    server = start_server(
        [sys.executable, "-m", "bubo", "serve", "--port", str(port)],
        port,
        tmp_path_factory.mktemp("open-think") / "server.log",
        env={"BUBO_CHAT_TEMPLATE_FILE": str(FIXTURES / "qwen3_open_think.jinja")},
    )
    yield server
    stop_server(server)


@pytest.fixture(name="reasoning_off_server", scope="module")
def _reasoning_off_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default model behind DeepSeek-R1-Distill's template, which always opens <think>, with --reasoning off."""
    port = free_port()
    template = FIXTURES / "llama_cpp_templates" / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
    server = start_server(
        [sys.executable, "-m", "bubo", "serve", "--port", str(port), "--reasoning", "off"],
        port,
        tmp_path_factory.mktemp("reasoning-off") / "server.log",
        env={"BUBO_CHAT_TEMPLATE_FILE": str(template)},
    )
    yield server
    stop_server(server)


class TestReasoningOff:
    QUESTION = [{"role": "user", "content": "Name a colour."}]

    def test_the_block_the_template_opens_is_closed(
        self, reasoning_off_server: Server, sdk: contextlib.ExitStack
    ) -> None:
        """The prompt ends <think>\n</think>; both SDKs get the answer as text, with no reasoning."""
        with httpx.Client(base_url=reasoning_off_server.base_url, timeout=60) as http:
            prompt = http.post("/apply-template", json={"messages": self.QUESTION}).json()["prompt"]
        assert prompt.endswith("<think>\n</think>")
        chat = sdk.enter_context(openai_client(reasoning_off_server)).chat.completions.create(
            model="bubo", messages=self.QUESTION, max_tokens=16, temperature=0
        )
        message = chat.choices[0].message
        assert message.content
        assert "reasoning_content" not in (message.model_extra or {})
        reply = sdk.enter_context(anthropic_client(reasoning_off_server)).messages.create(
            model="bubo", max_tokens=16, messages=self.QUESTION, extra_body={"temperature": 0}
        )
        assert [block.type for block in reply.content] == ["text"]


class TestThinkingBudget:
    QUESTION = [{"role": "user", "content": "Tell me about lighthouses."}]

    def test_budget_ends_thinking(self, open_think_server: Server, sdk: contextlib.ExitStack) -> None:
        """The output starts inside <think>; without a budget it never leaves, with one it answers."""
        client = sdk.enter_context(anthropic_client(open_think_server))
        free = client.messages.create(
            model="bubo", max_tokens=60, messages=self.QUESTION, extra_body={"temperature": 0}
        )
        assert [block.type for block in free.content] == ["thinking"]
        assert free.stop_reason == "max_tokens"
        capped = client.messages.create(
            model="bubo", max_tokens=60, messages=self.QUESTION,
            thinking={"type": "enabled", "budget_tokens": 5}, extra_body={"temperature": 0},
        )  # fmt: skip
        assert [block.type for block in capped.content] == ["thinking", "text"]
        assert len(capped.content[0].thinking) < len(free.content[0].thinking)  # type: ignore[union-attr]
        assert capped.content[1].text  # type: ignore[union-attr]

    def test_budget_counts_reasoning_tokens(
        self, open_think_server: Server, sdk: contextlib.ExitStack
    ) -> None:
        """OpenAI chat's thinking budget caps the reasoning tokens usage reports."""
        client = sdk.enter_context(openai_client(open_think_server))
        completion = client.chat.completions.create(
            model="bubo", messages=self.QUESTION, max_tokens=60, temperature=0,
            extra_body={"thinking": {"type": "enabled", "budget_tokens": 5}},
        )  # fmt: skip
        reasoning = completion.usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
        assert 5 <= reasoning <= 5 + 8  # the budget, plus the inserted "</think>" tokens
        assert completion.choices[0].message.content
