"""Tool calls, reasoning and structured output in every dialect (fake engine, scripted replies)."""

from __future__ import annotations

import json

import pytest
from dirty_equals import IsStr

from bubo.domain.generation import GrammarSpec
from bubo.engine.fake import FakeEngine, FakeScript

from .._asgi import post_stream
from .._sse import payloads as data_events

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
USER = [{"role": "user", "content": "Weather in Paris?"}]


def planned_grammar(engine: FakeEngine) -> GrammarSpec:
    """The grammar the service planned for the last request, checked to be the one it runs with."""
    spec, text = engine.compiled[-1]
    assert engine.requests[-1].grammar == text
    return spec


def chat(**fields: object) -> dict[str, object]:
    return {"model": "bubo", "messages": USER, "tools": [{"type": "function", "function": WEATHER}], **fields}


class TestOpenAIChatTools:
    async def test_call_in_the_response(self, app, script: FakeScript) -> None:
        """A call the model writes becomes message.tool_calls; content is null; finish_reason tool_calls."""
        script.reply = CALL_TEXT
        body = await (await app.test_client().post("/v1/chat/completions", json=chat())).get_json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"] == {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": IsStr(regex=r"call_[a-z0-9]{20}"), "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
            ],
        }  # fmt: skip

    async def test_streamed_call(self, app, script: FakeScript) -> None:
        """Streaming sends the id and name first, then argument fragments."""
        script.reply = CALL_TEXT
        events = data_events(await post_stream(app.app, "/v1/chat/completions", chat(stream=True)))
        calls = [
            e["choices"][0]["delta"]["tool_calls"][0]
            for e in events
            if e["choices"] and "tool_calls" in e["choices"][0]["delta"]
        ]
        assert calls[0] == {
            "index": 0,
            "id": IsStr(regex=r"call_[a-z0-9]{20}"),
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
        assert "".join(c["function"]["arguments"] for c in calls[1:]) == '{"city":"Paris"}'
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"

    async def test_tool_choice_required_sets_a_grammar(self, app, fake_engine: FakeEngine) -> None:
        """tool_choice required constrains decoding with a grammar over every tool."""
        await app.test_client().post("/v1/chat/completions", json=chat(tool_choice="required"))
        grammar = planned_grammar(fake_engine)
        assert "get_weather" in grammar.rules
        assert [name for name, _ in grammar.schemas] == ["args-0"]

    async def test_named_choice_and_parallel_off(self, app, fake_engine: FakeEngine) -> None:
        """A named choice forces exactly that tool; parallel_tool_calls false allows one call."""
        other = {**WEATHER, "name": "get_time"}
        body = chat(
            tools=[{"type": "function", "function": WEATHER}, {"type": "function", "function": other}],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False,
        )
        await app.test_client().post("/v1/chat/completions", json=body)
        grammar = planned_grammar(fake_engine)
        assert "get_time" in grammar.rules
        assert "get_weather" not in grammar.rules
        assert "( ws call )*" not in grammar.rules

    async def test_tool_choice_none_offers_no_tools(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """tool_choice none renders no tools and parses no calls."""
        await app.test_client().post("/v1/chat/completions", json=chat(tool_choice="none"))
        assert "get_weather" not in tokenizer.decode(fake_engine.requests[-1].prompt_tokens)

    @pytest.mark.parametrize(
        ("fields", "param", "code"),
        [
            ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name", "invalid_request"),
            ({"tool_choice": "required", "tools": []}, "tool_choice", "invalid_request"),
            ({"tool_choice": "sometimes"}, "tool_choice", "parse_error"),
        ],
    )  # fmt: skip
    async def test_bad_tool_choice(self, app, fields, param, code) -> None:
        """An unknown tool name or an unsatisfiable choice is a 400."""
        response = await app.test_client().post("/v1/chat/completions", json=chat(**fields))
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["param"], error["code"]) == (param, code)

    async def test_tool_result_round_trip(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """A tool result sent back is rendered after the call (generic format for ChatML)."""
        messages = [
            *USER,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
        ]  # fmt: skip
        response = await app.test_client().post("/v1/chat/completions", json=chat(messages=messages))
        assert response.status_code == 200
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert prompt.index('"name": "get_weather"') < prompt.index("Sunny, 21 C")


class TestStructuredOutput:
    async def test_json_schema_sets_a_grammar(self, app, fake_engine: FakeEngine) -> None:
        """response_format json_schema constrains the whole answer to the schema."""
        fake_engine.script.reply = '{"a": 1}'  # the fake ignores grammars; the answer is checked
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        response = await app.test_client().post(
            "/v1/chat/completions",
            json={
                "model": "bubo",
                "messages": USER,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
        )
        assert response.status_code == 200
        grammar = planned_grammar(fake_engine)
        assert grammar.schemas == (("output", schema),)

    @pytest.mark.parametrize(
        ("schema", "path", "keyword"),
        [
            ({"minimum": 1}, ".minimum", "minimum"),  # bounds are enforced on integers and numbers only
            ({"type": "number", "multipleOf": 0.5}, ".multipleOf", "multipleOf"),  # not 10^-k, not whole
            (
                {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
                ".properties.a.not",
                "not",
            ),
            ({"type": "string", "format": "email"}, ".format", "email"),
            ({"$ref": "https://example.com/schema.json"}, ".$ref", "https://example.com"),
            ({"type": "array", "uniqueItems": "yes"}, ".uniqueItems", "must be a boolean"),
            # llama.cpp's converter needs anchored patterns
            ({"type": "string", "pattern": "[a-z]+"}, ".pattern", "must start with ^ and end with $"),
            ({"$ref": "#/$defs/missing"}, ".$ref", "points at nothing"),
        ],
    )
    async def test_unsupported_constructs_are_refused(self, app, schema, path, keyword) -> None:
        """A construct the grammar cannot enforce is a 400 naming it and its path, not an unconstrained run."""
        response = await app.test_client().post(
            "/v1/chat/completions",
            json={
                "model": "bubo",
                "messages": USER,
                "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
            },
        )
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == (
            "unsupported_schema",
            "response_format.json_schema.schema" + path,
        )
        assert keyword in error["message"]

    async def test_json_object(self, app, fake_engine: FakeEngine) -> None:
        """json_object asks for any JSON object."""
        await app.test_client().post(
            "/v1/chat/completions",
            json={"model": "bubo", "messages": USER, "response_format": {"type": "json_object"}},
        )
        grammar = planned_grammar(fake_engine)
        assert grammar.schemas == (("output", {"type": "object"}),)


class TestReasoning:
    async def test_split_in_chat(self, thinking_app, script: FakeScript) -> None:
        """<think> output becomes reasoning_content (and reasoning); the rest is content."""
        script.reply = "<think>\nThe user wants a greeting.\n</think>\n\nHi there!"
        body = await (
            await thinking_app.test_client().post(
                "/v1/chat/completions", json={"model": "bubo", "messages": USER}
            )
        ).get_json()
        message = body["choices"][0]["message"]
        assert message == {
            "role": "assistant",
            "content": "Hi there!",
            "reasoning_content": "The user wants a greeting.",
            "reasoning": "The user wants a greeting.",
        }
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0

    async def test_split_in_chat_stream(self, thinking_app, script: FakeScript) -> None:
        """Streamed reasoning arrives in delta.reasoning_content, the answer in delta.content."""
        script.reply = "<think>\nHmm, a greeting.\n</think>\n\nHi there!"
        events = data_events(
            await post_stream(
                thinking_app.app, "/v1/chat/completions", {"model": "bubo", "messages": USER, "stream": True}
            )
        )
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Hmm, a greeting."
        assert "".join(d.get("content") or "" for d in deltas) == "Hi there!"

    async def test_split_in_anthropic(self, thinking_app, script: FakeScript) -> None:
        """Anthropic gets a thinking block, then a text block."""
        script.reply = "<think>\nPlan it.\n</think>\n\nDone."
        body = await (
            await thinking_app.test_client().post(
                "/v1/messages", json={"model": "bubo", "max_tokens": 50, "messages": USER}
            )
        ).get_json()
        assert body["content"] == [
            {"type": "thinking", "thinking": "Plan it.", "signature": ""},
            {"type": "text", "text": "Done."},
        ]

    async def test_split_in_responses(self, thinking_app, script: FakeScript) -> None:
        """Responses gets a reasoning item, then a message item."""
        script.reply = "<think>\nPlan it.\n</think>\n\nDone."
        body = await (
            await thinking_app.test_client().post("/v1/responses", json={"model": "bubo", "input": "Hi"})
        ).get_json()
        assert [item["type"] for item in body["output"]] == ["reasoning", "message"]
        assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "Plan it."}]
        assert body["output"][1]["content"][0]["text"] == "Done."
        assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/chat/completions", {"model": "bubo", "messages": USER, "reasoning_effort": "off"}),
            ("/v1/chat/completions", {"model": "bubo", "messages": USER, "thinking": {"type": "disabled"}}),
            (
                "/v1/messages",
                {"model": "bubo", "max_tokens": 5, "messages": USER, "thinking": {"type": "disabled"}},
            ),
            (  # Claude Code's effort beside thinking off: thinking stays off
                "/v1/messages",
                {
                    "model": "bubo",
                    "max_tokens": 5,
                    "messages": USER,
                    "thinking": {"type": "disabled"},
                    "output_config": {"effort": "high"},
                },
            ),
            ("/v1/responses", {"model": "bubo", "input": "Hi", "reasoning": {"effort": "none"}}),
            ("/v1/chat/completions", {"model": "bubo", "messages": USER, "reasoning_effort": "none"}),
        ],
    )
    async def test_thinking_off_reaches_the_template(
        self, thinking_app, fake_engine: FakeEngine, tokenizer, path, body
    ) -> None:
        """Turning thinking off renders enable_thinking false (the template closes <think> itself)."""
        response = await thinking_app.test_client().post(path, json=body)
        assert response.status_code == 200
        assert tokenizer.decode(fake_engine.requests[-1].prompt_tokens).endswith("<think>\n\n</think>\n\n")

    async def test_effort_reaches_the_template(self, make_runtime, settings) -> None:
        """Other effort levels reach the template as reasoning_effort."""
        import attrs

        from bubo.server import create_app
        from bubo.templates import ChatTemplate

        from ..conftest import wait_until_ready

        template = ChatTemplate(
            "{{ reasoning_effort }}|{{ enable_thinking }}", bos_token="", eos_token="", origin="t"
        )
        runtime = attrs.evolve(make_runtime(), template=template)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            response = await test_app.test_client().post(
                "/apply-template", json={"messages": USER, "reasoning_effort": "high"}
            )
        assert (await response.get_json())["prompt"] == "high|True"

    async def test_budget_reaches_the_engine(self, thinking_app, fake_engine: FakeEngine, tokenizer) -> None:
        """Anthropic's budget_tokens becomes a thinking budget, its closing markup in the service's tokens."""
        body = {
            "model": "bubo",
            "max_tokens": 50,
            "messages": USER,
            "thinking": {"type": "enabled", "budget_tokens": 7},
        }
        await thinking_app.test_client().post("/v1/messages", json=body)
        budget = fake_engine.requests[-1].thinking_budget
        assert budget is not None
        assert (budget.budget, budget.end_text) == (7, "</think>")
        assert budget.end_tokens == tuple(tokenizer.encode("\n</think>\n\n"))

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"reasoning_effort": "off", "thinking": {"type": "enabled"}}, "thinking"),
            ({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs.enable_thinking"),
            ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs.enable_thinking"),
            ({"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"}}, "chat_template_kwargs.reasoning_effort"),
        ],
    )  # fmt: skip
    async def test_disagreements_are_400s_naming_both(self, thinking_app, body, param) -> None:
        """Top-level fields and chat_template_kwargs must agree; the error names both fields."""
        response = await thinking_app.test_client().post(
            "/v1/chat/completions", json={"model": "bubo", "messages": USER, **body}
        )
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("conflicting_reasoning", param)
        fields = [f for f in ("reasoning_effort", "thinking", "chat_template_kwargs") if f in body]
        assert all(field in error["message"] for field in fields)

    async def test_unknown_effort_is_a_400(self, thinking_app) -> None:
        response = await thinking_app.test_client().post(
            "/v1/chat/completions", json={"model": "bubo", "messages": USER, "reasoning_effort": "extreme"}
        )
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("parse_error", "reasoning_effort")


class TestOtherDialectsTools:
    async def test_anthropic_tool_use(self, app, script: FakeScript) -> None:
        """Anthropic gets a tool_use block and stop_reason tool_use."""
        script.reply = CALL_TEXT
        body = {
            "model": "bubo",
            "max_tokens": 50,
            "messages": USER,
            "tools": [{"name": "get_weather", "input_schema": WEATHER["parameters"]}],
        }
        message = await (await app.test_client().post("/v1/messages", json=body)).get_json()
        assert message["stop_reason"] == "tool_use"
        assert message["content"] == [
            {
                "type": "tool_use",
                "id": IsStr(regex="toolu_[a-z0-9]{20}"),
                "name": "get_weather",
                "input": {"city": "Paris"},
            }
        ]

    async def test_anthropic_tool_choice(self, app, fake_engine: FakeEngine) -> None:
        """any forces some tool, tool forces one, disable_parallel_tool_use allows one call."""
        tools = [{"name": "get_weather", "input_schema": WEATHER["parameters"]}]
        client = app.test_client()
        await client.post(
            "/v1/messages",
            json={
                "model": "bubo",
                "max_tokens": 5,
                "messages": USER,
                "tools": tools,
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            },
        )
        grammar = planned_grammar(fake_engine)
        assert "( ws call )*" not in grammar.rules
        response = await client.post(
            "/v1/messages",
            json={
                "model": "bubo",
                "max_tokens": 5,
                "messages": USER,
                "tools": tools,
                "tool_choice": {"type": "tool", "name": "nope"},
            },
        )
        assert response.status_code == 400
        assert (await response.get_json())["error"]["type"] == "invalid_request_error"

    async def test_anthropic_output_format(self, app, fake_engine: FakeEngine) -> None:
        """output_config.format constrains the answer to the schema."""
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
        await app.test_client().post(
            "/v1/messages",
            json={
                "model": "bubo",
                "max_tokens": 5,
                "messages": USER,
                "output_config": {"format": {"type": "json_schema", "schema": schema}},
            },
        )
        grammar = planned_grammar(fake_engine)
        assert grammar.schemas == (("output", schema),)

    async def test_responses_function_call(self, app, script: FakeScript) -> None:
        """Responses gets a function_call item."""
        script.reply = CALL_TEXT
        body = {"model": "bubo", "input": "Weather in Paris?", "tools": [{"type": "function", **WEATHER}]}
        response = await (await app.test_client().post("/v1/responses", json=body)).get_json()
        assert [item["type"] for item in response["output"]] == ["function_call"]
        assert response["output"][0]["arguments"] == '{"city":"Paris"}'
        assert response["output"][0]["call_id"] == IsStr(regex="call_[a-z0-9]{20}")

    async def test_responses_tool_choice_and_format(self, app, fake_engine: FakeEngine) -> None:
        """Responses tool_choice forces calls; text.format json_schema forces JSON."""
        client = app.test_client()
        tools = [{"type": "function", **WEATHER}]
        await client.post(
            "/v1/responses",
            json={
                "model": "bubo",
                "input": "x",
                "tools": tools,
                "tool_choice": {"type": "function", "name": "get_weather"},
            },
        )
        assert fake_engine.requests[-1].grammar is not None
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        await client.post(
            "/v1/responses",
            json={
                "model": "bubo",
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}},
            },
        )
        grammar = planned_grammar(fake_engine)
        assert grammar.schemas == (("output", schema),)


# A Llama-3.3-style template: tools in the first user turn, a call is a bare JSON object with "parameters".
LLAMA_33_STYLE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    'that best answers the given prompt. Respond in the format {"name": function name, "parameters": '
    "dictionary of argument name and its value}.\n\n{%- for t in tools %}{{ t | tojson }}\n\n{% endfor %}"
    "{{ message['content'] }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)


class TestStreamingWithToolsOffered:
    """Issue 24's Llama-3.3-style template, and any other: text streams with tools offered."""

    @pytest.fixture(name="llama_app")
    async def _llama_app(self, make_runtime, settings):
        import attrs

        from bubo.server import create_app
        from bubo.templates import ChatTemplate

        from ..conftest import wait_until_ready

        template = ChatTemplate(LLAMA_33_STYLE, bos_token="", eos_token="", origin="test")
        runtime = attrs.evolve(make_runtime(), template=template)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            yield test_app

    WEATHER = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }

    async def test_a_plain_answer_streams_as_content(self, llama_app, script: FakeScript) -> None:
        """Tools offered, none called: the answer arrives as many content deltas, from the first token on."""
        script.reply = "The weather in Paris is usually mild in spring."
        body = {"model": "bubo", "messages": USER, "tools": [self.WEATHER], "stream": True}
        raw = await post_stream(llama_app.app, "/v1/chat/completions", body)
        chunks = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        contents = [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")]
        texts = [t for t in contents if t]
        assert "".join(texts) == script.reply
        assert len(texts) > 5

    async def test_a_bare_call_with_parameters_streams_its_arguments(
        self, llama_app, script: FakeScript
    ) -> None:
        """Llama 3's bare {"name", "parameters"} call is a call; its arguments arrive in several deltas."""
        script.reply = '{"name": "get_weather", "parameters": {"city": "Paris, the capital of France"}}'
        body = {"model": "bubo", "messages": USER, "tools": [self.WEATHER], "stream": True}
        raw = await post_stream(llama_app.app, "/v1/chat/completions", body)
        chunks = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
        calls = [
            d["tool_calls"][0]
            for c in chunks
            if c.get("choices")
            for d in [c["choices"][0]["delta"]]
            if d.get("tool_calls")
        ]
        assert calls[0]["function"]["name"] == "get_weather"
        fragments = [call["function"]["arguments"] for call in calls[1:]]
        assert len(fragments) > 2
        assert json.loads("".join(fragments)) == {"city": "Paris, the capital of France"}
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" or any(
            c["choices"][0].get("finish_reason") == "tool_calls" for c in chunks if c.get("choices")
        )
