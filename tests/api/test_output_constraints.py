"""llama-server's `grammar`, `json_schema` and `response_format.schema` constrain the answer; none is ignored."""

from __future__ import annotations

import pytest

from bubo.engine.fake import FakeEngine

YES_NO = 'root ::= "yes" | "no"'
SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}
ANSWER = '{"answer": true}'  # the fake engine ignores grammars; the answer is checked against the schema
CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 8}
COMPLETION = {"prompt": "Is the sky blue?", "n_predict": 8}
OPENAI_COMPLETION = {"model": "bubo", "prompt": "Is the sky blue?", "max_tokens": 8}

ROUTES = [
    ("/v1/chat/completions", CHAT),
    ("/completion", COMPLETION),
    ("/v1/completions", OPENAI_COMPLETION),
]


def sent_grammar(fake_engine: FakeEngine) -> str | None:
    return fake_engine.requests[-1].grammar


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_grammar_constrains_the_answer(app, fake_engine: FakeEngine, path: str, body: dict) -> None:
    response = await app.test_client().post(path, json={**body, "grammar": YES_NO})
    assert response.status_code == 200
    assert sent_grammar(fake_engine) == YES_NO


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_json_schema_constrains_the_answer(app, fake_engine: FakeEngine, path: str, body: dict) -> None:
    fake_engine.script.reply = ANSWER
    response = await app.test_client().post(path, json={**body, "json_schema": SCHEMA})
    assert response.status_code == 200
    grammar = sent_grammar(fake_engine)
    assert grammar is not None
    assert '\\"answer\\"' in grammar  # the schema's property, written into the grammar


@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
async def test_response_format_with_llama_server_schema(app, fake_engine: FakeEngine, kind: str) -> None:
    fake_engine.script.reply = ANSWER
    body = {**CHAT, "response_format": {"type": kind, "schema": SCHEMA}}
    response = await app.test_client().post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert '\\"answer\\"' in (sent_grammar(fake_engine) or "")


@pytest.mark.parametrize(
    ("path", "body", "fields", "param"),
    [
        ("/v1/chat/completions", CHAT, {"grammar": YES_NO, "json_schema": SCHEMA}, "grammar"),
        (
            "/v1/chat/completions",
            CHAT,
            {"response_format": {"type": "json_object"}, "grammar": YES_NO},
            "grammar",
        ),
        ("/completion", COMPLETION, {"json_schema": SCHEMA, "grammar": YES_NO}, "grammar"),
        ("/completion", COMPLETION, {"grammar": "  "}, "grammar"),
        (
            "/v1/completions",
            OPENAI_COMPLETION,
            {"json_schema": {"type": "object", "maxLength": 50000}},
            "json_schema.maxLength",
        ),
    ],
    ids=["chat-two", "chat-response-format-and-grammar", "completion-two", "empty", "schema-too-complex"],
)
async def test_refused_with_the_field_named(app, path: str, body: dict, fields: dict, param: str) -> None:
    response = await app.test_client().post(path, json={**body, **fields})
    assert response.status_code == 400
    assert (await response.get_json())["error"]["param"] == param


async def test_a_grammar_and_a_forced_tool_call_conflict(app) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {**CHAT, "tools": tools, "tool_choice": "required", "grammar": YES_NO}
    response = await app.test_client().post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert (await response.get_json())["error"]["param"] == "grammar"
