"""Nested Pydantic models (so ``$defs`` and ``$ref``) through the real clients that send them.

instructor's ``create_iterable`` (a forced tool whose parameters hold
``$defs.Person``) over the OpenAI and Anthropic SDKs, and the SDKs' own
``parse``, streamed and not, against the real server and model: each answer is
a 200 the client's own Pydantic parse accepts.  Schemas whose references lead
outside themselves are a 400, and a listener on 127.0.0.1 hears nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import httpx
import instructor
import pytest
from pydantic import BaseModel, Field
from tests._listener import Listener

from .conftest import Server, anthropic_client, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

GREEDY = {"temperature": 0}  # SmolLM2 sampling freely may ramble inside a string past any token limit
PEOPLE = [{"role": "user", "content": "Extract the people: Ada is 36 years old and Alan is 41."}]
TEAM = [{"role": "user", "content": "The team Owls has two members: Ada (36) and Alan (41)."}]


class Person(BaseModel):
    name: str = Field(max_length=24)  # bounded, so a tiny model's answer always ends within max_tokens
    age: int = Field(ge=0, le=150)


class Team(BaseModel):
    name: str = Field(max_length=24)
    members: list[Person] = Field(max_length=3)


class Member(BaseModel):
    name: Literal["Ada", "Alan"]  # an enum: constraints the Anthropic SDK keeps in the schema it sends
    age: int


class Pairing(BaseModel):
    """Two nested models, bounded without maxLength or maxItems, which the Anthropic SDK moves to descriptions."""

    lead: Member
    deputy: Member


@pytest.fixture(name="listener")
def _listener() -> Iterator[Listener]:
    with Listener() as listener:
        yield listener


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_instructor_iterable_over_openai(server: Server, sdk: contextlib.ExitStack, stream: bool) -> None:
    client = instructor.from_openai(sdk.enter_context(openai_client(server)), mode=instructor.Mode.TOOLS)
    people = client.chat.completions.create_iterable(
        model="bubo", response_model=Person, messages=PEOPLE, max_tokens=400, stream=stream, max_retries=0,
        **GREEDY,
    )  # fmt: skip
    assert all(isinstance(person, Person) for person in people)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_instructor_iterable_over_anthropic(server: Server, sdk: contextlib.ExitStack, stream: bool) -> None:
    client = instructor.from_anthropic(
        sdk.enter_context(anthropic_client(server)), mode=instructor.Mode.TOOLS
    )
    people = client.messages.create_iterable(
        model="bubo", response_model=Person, messages=PEOPLE, max_tokens=400, stream=stream, max_retries=0,
        extra_body=GREEDY,  # the SDK takes no temperature argument any more; the API and Bubo do
    )  # fmt: skip
    assert all(isinstance(person, Person) for person in people)


def test_openai_parse_of_nested_models(server: Server, sdk: contextlib.ExitStack) -> None:
    oai = sdk.enter_context(openai_client(server))
    completion = oai.chat.completions.parse(
        model="bubo", messages=TEAM, response_format=Team, max_tokens=400, **GREEDY
    )
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(completion.choices[0].message.parsed, Team)
    with oai.chat.completions.stream(
        model="bubo", messages=TEAM, response_format=Team, max_tokens=400
    ) as events:
        final = events.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Team)


def test_anthropic_parse_of_nested_models(server: Server, sdk: contextlib.ExitStack) -> None:
    client = sdk.enter_context(anthropic_client(server))
    message = client.messages.parse(
        model="bubo", messages=TEAM, output_format=Pairing, max_tokens=400, extra_body=GREEDY
    )
    assert message.stop_reason == "end_turn"
    assert isinstance(message.parsed_output, Pairing)


def test_references_outside_the_schema_reach_nobody(http: httpx.Client, listener: Listener) -> None:
    schemas = [
        {
            "type": "object",
            "$defs": {"A": {"type": "string"}},
            "properties": {"a": {"$id": f"{listener.url}/x/", "$ref": "#/$defs/A"}},
        },
        {"$id": f"{listener.url}/root.json", "properties": {"a": {"$ref": "other.json"}}},
        {"$ref": f"{listener.url}/schema.json"},
    ]
    for schema in schemas:
        chat = http.post(
            "/v1/chat/completions",
            json={
                "model": "bubo",
                "messages": PEOPLE,
                "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            },
        )
        assert (chat.status_code, chat.json()["error"]["code"]) == (400, "unsupported_schema")
        messages = http.post(
            "/v1/messages",
            json={
                "model": "bubo",
                "messages": PEOPLE,
                "max_tokens": 8,
                "tools": [{"name": "t", "input_schema": schema}],
                "tool_choice": {"type": "any"},
            },
        )
        assert (messages.status_code, messages.json()["error"]["code"]) == (400, "unsupported_schema")
    assert listener.connections == 0
