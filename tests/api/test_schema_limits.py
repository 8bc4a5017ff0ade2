"""Hostile schemas in every field that carries one: a 400 naming the field, before anything is queued."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from quart_trio import QuartTrio

from bubo.config import Settings
from bubo.engine.fake import FakeEngine
from bubo.grammar.schema import LIMITS
from bubo.templates import ChatTemplate

from ..conftest import RuntimeFactory, serving_app

USER = [{"role": "user", "content": "Hi"}]

# The schemas that crashed, hung or failed the server, and where the refusal points inside them.
HOSTILE: dict[str, tuple[dict[str, Any], str, str]] = {
    "maxLength": (
        {"type": "object", "properties": {"x": {"type": "string", "maxLength": 20_000}}},
        ".properties.x.maxLength",
        "schema_too_complex",
    ),
    "maxItems": (
        {"type": "array", "items": {"type": "integer"}, "maxItems": 50_000},
        ".maxItems",
        "schema_too_complex",
    ),
    "nesting": ({}, ".items" * LIMITS.depth, "schema_too_complex"),  # filled in below: 500 levels of items
    "enum": ({"enum": [f"v{i}" for i in range(100_000)]}, ".enum", "schema_too_complex"),
    "pattern": ({"type": "string", "pattern": "^(($"}, ".pattern", "unsupported_schema"),
}
DEEP: dict[str, Any] = {"type": "string"}
for _ in range(499):
    DEEP = {"type": "array", "items": DEEP}
HOSTILE["nesting"] = (DEEP, *HOSTILE["nesting"][1:])


def bodies(schema: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any], str]]:
    """Each field a schema can arrive in: (route, body, the field's path)."""
    return {
        "chat response_format": (
            "/v1/chat/completions",
            {"model": "bubo", "messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
            "response_format.json_schema.schema",
        ),
        "chat forced tool": (
            "/v1/chat/completions",
            {
                "model": "bubo",
                "messages": USER,
                "tools": [
                    {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
                    {"type": "function", "function": {"name": "f", "parameters": schema}},
                ],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[1].function.parameters",
        ),
        "responses text.format": (
            "/v1/responses",
            {"model": "bubo", "input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}},
            "text.format.schema",
        ),
        "responses forced tool": (
            "/v1/responses",
            {
                "model": "bubo",
                "input": "Hi",
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "tool_choice": "required",
            },
            "tools[0].parameters",
        ),
        "anthropic output_config": (
            "/v1/messages",
            {"model": "bubo", "max_tokens": 8, "messages": USER, "output_config": {"format": {"type": "json_schema", "schema": schema}}},
            "output_config.format.schema",
        ),
        "anthropic forced tool": (
            "/v1/messages",
            {
                "model": "bubo",
                "max_tokens": 8,
                "messages": USER,
                "tools": [{"name": "f", "input_schema": schema}],
                "tool_choice": {"type": "tool", "name": "f"},
            },
            "tools[0].input_schema",
        ),
    }  # fmt: skip


FIELDS = list(bodies({}))


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("case", list(HOSTILE))
async def test_refused_with_the_path_of_the_field(
    app, fake_engine: FakeEngine, case: str, field: str
) -> None:
    """A schema over a limit, or with a pattern the converter cannot take, is a 400 naming the keyword's path."""
    schema, path, code = HOSTILE[case]
    route, body, param = bodies(schema)[field]
    response = await app.test_client().post(route, json=body)
    assert response.status_code == 400
    payload = await response.get_json()
    error = payload["error"]
    assert error["code"] == code  # Anthropic's envelope carries the code beside its own type
    if route != "/v1/messages":
        assert error["param"] == param + path
    assert param + path in error["message"] or path.lstrip(".") in error["message"]
    assert fake_engine.requests == []  # refused before anything was queued


async def test_the_limit_is_in_the_message(app) -> None:
    """The message says what the limit is, so the client knows what to change."""
    schema, _, _ = HOSTILE["maxLength"]
    route, body, _ = bodies(schema)["chat response_format"]
    error = (await (await app.test_client().post(route, json=body)).get_json())["error"]
    assert error["message"] == (
        "the JSON schema at $.properties.x.maxLength is 20000; at most 1000 is supported "
        "(each repetition is written out in the grammar)"
    )


async def test_a_schema_at_the_limits_is_served(app, fake_engine: FakeEngine) -> None:
    """Right at the limits the request runs: the limits refuse only what is over them."""
    fake_engine.script.reply = '{"name": "owl", "tags": ["t1"]}'  # the answer is checked against the schema
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": LIMITS.repetition},
            "code": {"type": "string", "pattern": "^[a-z]{1,10}$"},
            "tags": {"type": "array", "items": {"enum": [f"t{i}" for i in range(LIMITS.alternatives)]}},
        },
    }
    route, body, _ = bodies(schema)["chat response_format"]
    response = await app.test_client().post(route, json=body)
    assert response.status_code == 200
    assert len(fake_engine.requests) == 1


@pytest.fixture(name="unrenderable_app")
async def _unrenderable_app(settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    """The app over a template that fails whenever it is rendered."""
    template = ChatTemplate('{{ raise_exception("rendered") }}', bos_token="", eos_token="", origin="test")
    runtime = attrs.evolve(make_runtime(), template=template)
    async with serving_app(settings, runtime) as test_app:
        yield test_app


@pytest.mark.parametrize("field", ["chat forced tool", "chat response_format"])
async def test_checked_before_the_prompt_is_rendered(unrenderable_app, field: str) -> None:
    """The schema check comes first: a 100,000-value enum in a tool is not rendered into a prompt (5.8 s)."""
    route, body, param = bodies(HOSTILE["enum"][0])[field]
    response = await unrenderable_app.test_client().post(route, json=body)
    error = (await response.get_json())["error"]
    assert (response.status_code, error["code"], error["param"]) == (
        400,
        "schema_too_complex",
        param + ".enum",
    )
