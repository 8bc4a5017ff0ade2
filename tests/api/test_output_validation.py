"""A structured answer the model ended is checked against its schema; a mismatch is the model's error.

The fake engine writes what the script says, grammar or not, so these play a
model whose answer breaks what no grammar enforces (``uniqueItems``).
"""

from __future__ import annotations

import json

import pytest

from bubo.engine.fake import FakeScript

SCHEMA = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["tags"],
}
TWICE = '{"tags": ["owl", "owl"]}'
MESSAGES = [{"role": "user", "content": "Tags?"}]
CHAT = {"model": "bubo", "messages": MESSAGES, "max_tokens": 64}
WHERE = "at $.tags, 'owl' is in the array more than once"

# the route, the body asking for SCHEMA, and the field that holds it
ROUTES = [
    (
        "/v1/chat/completions",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}}},
        "response_format.json_schema.schema",
    ),
    ("/completion", {"prompt": "Tags?", "n_predict": 64, "json_schema": SCHEMA}, "json_schema"),
    (
        "/v1/responses",
        {
            "model": "bubo",
            "input": "Tags?",
            "text": {"format": {"type": "json_schema", "name": "t", "schema": SCHEMA}},
        },
        "text.format.schema",
    ),
    (
        "/v1/messages",
        {**CHAT, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
        "output_config.format.schema",
    ),
]


def sse_data(body: bytes) -> list[str]:
    return [
        line.removeprefix("data: ")
        for event in body.decode().split("\n\n")
        for line in event.split("\n")
        if line.startswith("data: ")
    ]


@pytest.mark.parametrize(
    ("path", "body", "field"), ROUTES, ids=["chat", "completion", "responses", "messages"]
)
async def test_a_mismatch_is_an_error_naming_the_output_path_and_the_keyword(
    app, script: FakeScript, path: str, body: dict, field: str
) -> None:
    """Duplicated items under uniqueItems: a 500 output_schema_mismatch, not a 200 the client's parser rejects."""
    script.reply = TWICE
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 500
    error = (await response.get_json())["error"]
    assert error["code"] == "output_schema_mismatch"
    assert WHERE in error["message"]
    if path != "/v1/messages":  # Anthropic's envelope has no param
        assert error["param"] == field + ".properties.tags.uniqueItems"


@pytest.mark.parametrize(
    ("path", "body", "field"), ROUTES, ids=["chat", "completion", "responses", "messages"]
)
async def test_a_stream_ends_with_the_error_event(
    app, script: FakeScript, path: str, body: dict, field: str
) -> None:
    """The answer was streamed as it came; the check's verdict is the dialect's error event, last.

    Responses ends with ``response.failed`` (carrying the code) after its flat ``error`` event.
    """
    script.reply = TWICE
    response = await app.test_client().post(path, json={**body, "stream": True})
    events = [json.loads(data) for data in sse_data(await response.get_data())]
    if path == "/v1/responses":
        failed = events.pop()
        assert failed["type"] == "response.failed"
        assert failed["response"]["status"] == "failed"
        assert failed["response"]["error"]["code"] == "server_error"  # what OpenAI clients retry
        assert failed["response"]["error"]["type"] == "output_schema_mismatch"
    last = events[-1]
    error = last.get("error", last)  # Responses' error event is flat
    assert error["code"] == "output_schema_mismatch"
    assert WHERE in error["message"]
    if path != "/v1/messages":
        assert error["param"] == field + ".properties.tags.uniqueItems"


async def test_the_streamed_answer_is_the_models(app, script: FakeScript) -> None:
    """Nothing of the answer is held back or changed before the verdict."""
    script.reply = TWICE
    path, body, _ = ROUTES[0]
    events = sse_data(await (await app.test_client().post(path, json={**body, "stream": True})).get_data())
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")) == TWICE


@pytest.mark.parametrize(
    ("reply", "fields", "status"),
    [
        ('{"tags": ["owl", "hoot"]}', {}, 200),  # a match
        (TWICE, {"max_tokens": 2}, 200),  # cut by the limit: incomplete, not checked
        (TWICE, {"stop": ['owl",']}, 200),  # cut by the client's stop string
    ],
    ids=["match", "truncated", "stopped"],
)
async def test_only_a_finished_answer_is_checked(
    app, script: FakeScript, reply: str, fields: dict, status: int
) -> None:
    script.reply = reply
    path, body, _ = ROUTES[0]
    response = await app.test_client().post(path, json={**body, **fields})
    assert response.status_code == status


@pytest.mark.parametrize(
    ("schema", "reply", "words"),
    [
        ({"type": "number", "multipleOf": 0.01}, "0.07", None),  # exact decimals: 0.07 / 0.01 is 7
        ({"enum": [0.1, 0.2]}, "0.1", None),
        (
            {"type": "number", "exclusiveMinimum": 0.5},
            "0.5",
            "at $, 0.5 is less than or equal to the minimum of 0.5",
        ),
        ({"type": "array", "uniqueItems": True}, "[1, 1.0]", "1.0 is in the array more than once"),
        ({"type": "array", "uniqueItems": True}, "[1, true]", None),
        ({"type": "object"}, "[" * 5000 + "]" * 5000, "could not be checked"),
    ],
)
async def test_numbers_are_read_exactly(
    app, script: FakeScript, schema: dict, reply: str, words: str | None
) -> None:
    """Numbers compare as the decimals they are; a hostile answer is an error, never a crash."""
    script.reply = reply
    body = {
        **CHAT,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    }
    response = await app.test_client().post("/v1/chat/completions", json={**body, "max_tokens": 20_000})
    if words is None:
        assert response.status_code == 200
    else:
        assert response.status_code == 500
        assert words in (await response.get_json())["error"]["message"]


TAGGER = {"name": "tag", "parameters": SCHEMA}


@pytest.mark.parametrize(
    ("choice", "status"),
    [("required", 500), ({"type": "function", "function": {"name": "tag"}}, 500), ("auto", 200)],
    ids=["required", "named", "auto"],
)
async def test_a_forced_calls_arguments_are_checked(
    app, script: FakeScript, choice: object, status: int
) -> None:
    """A forced call's arguments are the grammar's answer too: checked against the tool's parameters.
    A call the model chose freely is not constrained, so not checked."""
    script.reply = '<tool_call>\n{"name": "tag", "arguments": ' + TWICE + "}\n</tool_call>"
    body = {**CHAT, "tools": [{"type": "function", "function": TAGGER}], "tool_choice": choice}
    response = await app.test_client().post("/v1/chat/completions", json=body)
    assert response.status_code == status
    if status == 500:
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == (
            "output_schema_mismatch",
            "tools[0].function.parameters.properties.tags.uniqueItems",
        )
        assert WHERE in error["message"]
