"""The official anthropic SDK against a real server with the real model."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import anthropic_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

# "Answer in English." gives the first token of the answer a wide margin: without it "The" leads "La" by
# 0.13 in log-probability, within what the unified KV cache's batch-dependent numbers move it
# (docs/llama-server.md, "Slots").
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in English."}]
SYSTEM = "You are a helpful assistant."


@pytest.fixture(name="client", scope="module")
def _client(server) -> Iterator[anthropic.Anthropic]:
    with anthropic_client(server, timeout=60) as client:
        yield client


def test_message(client: anthropic.Anthropic) -> None:
    """A non-streaming message answers with a text block and Anthropic usage."""
    message = client.messages.create(
        model="bubo", max_tokens=40, system=SYSTEM, messages=QUESTION, extra_body={"temperature": 0}
    )
    assert message.type == "message"
    assert message.id.startswith("msg_")
    assert message.content[0].type == "text"
    assert "Paris" in message.content[0].text
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens > 0
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 10


def test_streaming_events(client: anthropic.Anthropic) -> None:
    """messages.stream sees the exact event sequence and assembles the same message."""
    with client.messages.stream(
        model="bubo", max_tokens=40, system=SYSTEM, messages=QUESTION, extra_body={"temperature": 0}
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    raw = [k for k in kinds if k != "text"]
    assert raw[0] == "message_start"
    assert raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert "Paris" in final.content[0].text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0


def test_max_tokens_stop(client: anthropic.Anthropic) -> None:
    """Hitting max_tokens is stop_reason max_tokens."""
    message = client.messages.create(
        model="bubo", max_tokens=2, messages=[{"role": "user", "content": "Tell me a story."}]
    )
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 2


def test_count_tokens(client: anthropic.Anthropic) -> None:
    """count_tokens answers input_tokens."""
    counted = client.messages.count_tokens(model="bubo", system=SYSTEM, messages=QUESTION)
    assert counted.input_tokens > 10


def test_empty_messages(client: anthropic.Anthropic) -> None:
    """``messages: []`` is answered as llama-server answers it: a message written from the system turn alone,
    whose prompt is the one count_tokens counts."""
    message = client.messages.create(model="bubo", max_tokens=3, system=SYSTEM, messages=[])
    assert message.type == "message"
    assert message.content[0].type == "text"
    assert message.usage.output_tokens > 0
    counted = client.messages.count_tokens(model="bubo", system=SYSTEM, messages=[])
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == counted.input_tokens


def test_errors(client: anthropic.Anthropic) -> None:
    """Errors arrive as the SDK's typed exceptions with Anthropic error types."""
    with pytest.raises(anthropic.NotFoundError) as not_found:
        client.messages.create(model="claude-opus-4", max_tokens=5, messages=QUESTION)
    assert not_found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.count_tokens(model="bubo", messages=[{"role": "user", "content": [image]}])
    assert bad.value.body["error"]["code"] == "unsupported_content"  # type: ignore[index]


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=60)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[str | None, list[dict[str, str]]]:
    system = draw(st.none() | texts)
    turns = draw(st.integers(min_value=0, max_value=2))
    messages = []
    for _ in range(turns):
        messages += [{"role": "user", "content": draw(texts)}, {"role": "assistant", "content": draw(texts)}]
    messages.append({"role": "user", "content": draw(texts)})
    return system, messages


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversation=conversations())
def test_count_tokens_equals_input_tokens_of_a_real_call(client: anthropic.Anthropic, conversation) -> None:
    """For any conversation, count_tokens equals the input a real max_tokens: 1 call reports.

    Anthropic's usage splits input between input_tokens and cache_read_input_tokens
    (cache_creation_input_tokens is always 0 here); their sum is the prompt.
    """
    system, messages = conversation
    extra = {"system": system} if system is not None else {}
    counted = client.messages.count_tokens(model="bubo", messages=messages, **extra).input_tokens  # type: ignore[arg-type]
    usage = client.messages.create(model="bubo", max_tokens=1, messages=messages, **extra).usage  # type: ignore[arg-type]
    assert counted == usage.input_tokens + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0
    )
