"""The official openai SDK's Responses API against a real server with the real model."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from .conftest import openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

# "Answer in English." gives the first token of the answer a wide margin: without it "The" leads "La" by
# 0.13 in log-probability, within what the unified KV cache's batch-dependent numbers move it
# (docs/llama-server.md, "Slots").
QUESTION = "What is the capital of France? Answer in English."
INSTRUCTIONS = "You are a helpful assistant."


@pytest.fixture(name="client")
def _client(server) -> Iterator[openai.OpenAI]:
    with openai_client(server, timeout=60) as client:
        yield client


def test_create(client: openai.OpenAI) -> None:
    """A completed response with output_text and usage."""
    response = client.responses.create(
        model="bubo",
        instructions=INSTRUCTIONS,
        input=QUESTION,
        temperature=0,
        max_output_tokens=40,
    )
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert "Paris" in response.output_text
    assert response.usage is not None
    assert response.usage.output_tokens > 0
    assert 0 <= response.usage.input_tokens_details.cached_tokens < response.usage.input_tokens


def test_streaming_event_sequence(client: openai.OpenAI) -> None:
    """The streamed events come in the documented order with increasing sequence numbers."""
    stream = client.responses.create(
        model="bubo", instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
        max_output_tokens=40, stream=True,
    )  # fmt: skip
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "Paris" in text
    assert events[-1].response.output_text == text


def test_previous_response_id_continues(client: openai.OpenAI) -> None:
    """A continuation by id sees the earlier turn (its prompt is longer and mostly cached)."""
    first = client.responses.create(
        model="bubo", instructions=INSTRUCTIONS, input="My name is Ada.", max_output_tokens=16
    )
    second = client.responses.create(
        model="bubo",
        instructions=INSTRUCTIONS,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=16,
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None
    assert first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(first.id).id == first.id


def test_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    """Running out of max_output_tokens gives an incomplete response."""
    response = client.responses.create(model="bubo", input="Tell me a long story.", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_unknown_previous_response_is_not_found(client: openai.OpenAI) -> None:
    """An unknown previous_response_id is a 404 with a clear message."""
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="bubo", input="x", previous_response_id="resp_nope")
    assert caught.value.code == "response_not_found"


def test_input_items_an_agent_sends_back(client: openai.OpenAI) -> None:
    """The SDK's input items as an agent sends them (its earlier output objects, a call and its output,
    messages of each shape) are accepted, and the conversation reaches the model.
    """
    first = client.responses.create(
        model="bubo", instructions=INSTRUCTIONS, input=QUESTION, temperature=0, max_output_tokens=16
    )
    weather = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}
    second = client.responses.create(
        model="bubo",
        instructions=INSTRUCTIONS,
        temperature=0,
        max_output_tokens=16,
        tools=[weather],  # type: ignore[list-item]
        input=[
            {"role": "user", "content": QUESTION},
            *first.output,  # type: ignore[list-item]
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "And the weather?"}],
            },
        ],
    )
    assert second.status in ("completed", "incomplete")
    assert second.usage is not None
    assert first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
