"""A schema's references never make the server fetch anything, in any dialect that takes a schema.

Each hostile schema points at a listener on 127.0.0.1 that counts connections:
the request is a 400 ``unsupported_schema`` naming the reference before anything
is queued, and the listener hears nothing.  Schemas whose ``$id`` is that
listener's URL, with ``$defs`` and relative references, are served: the grammar
and the answer's check both resolve them inside the schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests._listener import Listener

from bubo.engine.fake import FakeEngine, FakeScript
from bubo.errors import OutputSchemaMismatch
from bubo.service.validation import check_output

MESSAGES = [{"role": "user", "content": "Who?"}]
CHAT = {"model": "bubo", "messages": MESSAGES, "max_tokens": 64}

Route = tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str, bool]
"""The path, the body holding a schema, the field holding it, whether the answer is a forced call."""

ROUTES: dict[str, Route] = {
    "chat": (
        "/v1/chat/completions",
        lambda s: {
            **CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": s}},
        },
        "response_format.json_schema.schema",
        False,
    ),
    "chat tool": (
        "/v1/chat/completions",
        lambda s: {
            **CHAT,
            "tools": [{"type": "function", "function": {"name": "t", "parameters": s, "strict": True}}],
            "tool_choice": "required",
        },
        "tools[0].function.parameters",
        True,
    ),
    "completions": (
        "/v1/completions",
        lambda s: {"model": "bubo", "prompt": "Who?", "max_tokens": 64, "json_schema": s},
        "json_schema",
        False,
    ),
    "completion": (
        "/completion",
        lambda s: {"prompt": "Who?", "n_predict": 64, "json_schema": s},
        "json_schema",
        False,
    ),
    "responses": (
        "/v1/responses",
        lambda s: {
            "model": "bubo",
            "input": "Who?",
            "text": {"format": {"type": "json_schema", "name": "p", "schema": s}},
        },
        "text.format.schema",
        False,
    ),
    "responses tool": (
        "/v1/responses",
        lambda s: {
            "model": "bubo",
            "input": "Who?",
            "tools": [{"type": "function", "name": "t", "parameters": s, "strict": True}],
            "tool_choice": "required",
        },
        "tools[0].parameters",
        True,
    ),
    "messages": (
        "/v1/messages",
        lambda s: {**CHAT, "output_config": {"format": {"type": "json_schema", "schema": s}}},
        "output_config.format.schema",
        False,
    ),
    "messages tool": (
        "/v1/messages",
        lambda s: {**CHAT, "tools": [{"name": "t", "input_schema": s}], "tool_choice": {"type": "any"}},
        "tools[0].input_schema",
        True,
    ),
}


def hostile(url: str) -> dict[str, tuple[dict[str, Any], str]]:
    """Schemas that would reach *url* under a resolver that fetches, with the path of the refused keyword."""
    return {
        "nested $id": (
            {
                "type": "object",
                "required": ["a"],
                "$defs": {"A": {"type": "string"}},
                "properties": {"a": {"$id": f"{url}/x/", "$ref": "#/$defs/A"}},
            },
            ".properties.a.$ref",
        ),
        "relative to a root $id": (
            {"$id": f"{url}/root.json", "type": "object", "properties": {"a": {"$ref": "other.json"}}},
            ".properties.a.$ref",
        ),
        "http": ({"type": "object", "properties": {"a": {"$ref": f"{url}/a.json"}}}, ".properties.a.$ref"),
        "https": ({"$ref": url.replace("http:", "https:") + "/a.json#/$defs/A"}, ".$ref"),
        "file": ({"$ref": "file:///etc/passwd"}, ".$ref"),
        "urn": ({"$ref": "urn:example:schema"}, ".$ref"),
        "$dynamicRef": (
            {"$defs": {"A": {"$dynamicAnchor": "a"}}, "$dynamicRef": f"{url}/x#a"},
            ".$dynamicRef",
        ),
    }


@pytest.fixture(name="listener")
def _listener() -> Iterator[Listener]:
    with Listener() as listener:
        yield listener


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "case", ["nested $id", "relative to a root $id", "http", "https", "file", "urn", "$dynamicRef"]
)
async def test_a_reference_outside_the_schema_is_refused_before_queueing(
    app, fake_engine: FakeEngine, listener: Listener, route: str, case: str
) -> None:
    path, body, field, _ = ROUTES[route]
    schema, where = hostile(listener.url)[case]
    response = await app.test_client().post(path, json=body(schema))
    assert response.status_code == 400
    error = (await response.get_json())["error"]
    assert error["code"] == "unsupported_schema"
    if path != "/v1/messages":  # Anthropic's envelope has no param
        assert error["param"] == field + where
    assert fake_engine.requests == []
    assert listener.connections == 0


def person_schema(url: str) -> dict[str, Any]:
    """pydantic's and instructor's shape, under a root ``$id`` that is the listener's URL."""
    return {
        "$id": f"{url}/people.json",
        "type": "object",
        "$defs": {
            "Person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"],
            }
        },
        "properties": {"people": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
        "required": ["people"],
    }


def reply(answer: str, forced: bool) -> str:
    return f'<tool_call>\n{{"name": "t", "arguments": {answer}}}\n</tool_call>' if forced else answer


@pytest.mark.parametrize("route", ROUTES)
async def test_a_schema_with_id_and_defs_is_served_and_its_answer_checked(
    app, script: FakeScript, fake_engine: FakeEngine, listener: Listener, route: str
) -> None:
    path, body, field, forced = ROUTES[route]
    script.reply = reply('{"people": [{"name": "Ada", "age": 36}]}', forced)
    response = await app.test_client().post(path, json=body(person_schema(listener.url)))
    assert response.status_code == 200, await response.get_data()
    spec = fake_engine.compiled[-1][0]
    assert "$id" not in json.dumps(spec.schemas)  # the grammar's schema is the bundled one

    script.reply = reply('{"people": [{"name": "Ada", "age": "old"}]}', forced)
    response = await app.test_client().post(path, json=body(person_schema(listener.url)))
    assert response.status_code == 500
    error = (await response.get_json())["error"]
    assert error["code"] == "output_schema_mismatch"
    assert "at $.people[0].age" in error["message"]
    if path != "/v1/messages":
        assert error["param"] == field + ".$defs.Person.properties.age.type"
    assert listener.connections == 0


def test_the_check_never_retrieves_even_a_reference_that_slipped_past(listener: Listener) -> None:
    """Belt and braces: the validator's registry refuses retrieval; the failed check is its own 500."""
    with pytest.raises(OutputSchemaMismatch) as caught:
        check_output('{"a": 1}', {"properties": {"a": {"$ref": f"{listener.url}/a.json"}}}, "json_schema")
    assert caught.value.code == "output_check_failed"
    assert "could not run" in str(caught.value)
    assert listener.connections == 0


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
@pytest.mark.parametrize("case", ["nested $id", "relative to a root $id", "http", "file"])
async def test_ollama_format_is_held_to_the_same_rule(
    app, fake_engine: FakeEngine, listener: Listener, path: str, case: str
) -> None:
    schema, _ = hostile(listener.url)[case]
    body = {"model": "bubo", "stream": False, "format": schema}
    body |= {"messages": MESSAGES} if path == "/api/chat" else {"prompt": "Who?"}
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 400
    assert "$ref" in (await response.get_json())["error"]
    assert fake_engine.requests == []
    assert listener.connections == 0
