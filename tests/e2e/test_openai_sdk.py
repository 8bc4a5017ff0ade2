"""The official openai SDK against a real server with the real model."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from .conftest import openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

# SmolLM2 answers this reliably with a plain system prompt (its built-in default one derails it).
# "Answer in English." gives the first token of the answer a wide margin: without it "The" leads "La" by
# 0.13 in log-probability, within what the unified KV cache's batch-dependent numbers move it
# (docs/llama-server.md, "Slots").
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France? Answer in English."},
]


@pytest.fixture(name="client")
def _client(server) -> Iterator[openai.OpenAI]:
    with openai_client(server, timeout=60) as client:
        yield client


def test_chat_completion(client: openai.OpenAI) -> None:
    """A non-streaming chat completion answers the question with usage."""
    completion = client.chat.completions.create(model="bubo", messages=QUESTION, max_tokens=40, temperature=0)
    choice = completion.choices[0]
    assert "Paris" in (choice.message.content or "")
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert completion.id.startswith("chatcmpl-")


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    """Streaming yields the role first, text deltas, the finish reason, then a usage chunk."""
    stream = client.chat.completions.create(
        model="bubo",
        messages=QUESTION,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def test_chat_logprobs(client: openai.OpenAI) -> None:
    """logprobs come back per token with alternatives."""
    completion = client.chat.completions.create(
        model="bubo",
        messages=[{"role": "user", "content": "Say yes."}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content
    assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in content)


def test_text_completion(client: openai.OpenAI) -> None:
    """The legacy completions endpoint continues raw text."""
    completion = client.completions.create(
        model="bubo", prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].text
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_models(client: openai.OpenAI) -> None:
    """The model list has the served id and bubo."""
    ids = [model.id for model in client.models.list()]
    assert ids == ["smollm2-135m-instruct-q4-1", "bubo"]


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    """The SDK sees a 404 for a model not served."""
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_found"


def test_a_final_assistant_message_is_continued(client: openai.OpenAI) -> None:
    """The model writes on from the assistant's text; the answer holds only the continuation.

    Rendered with a closed turn (the old behaviour) the prompt is one end of turn
    and one assistant header longer, and the model starts its count over.
    """
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Count from 1 to 10, separated by commas."},
        {"role": "assistant", "content": "1, 2, 3,"},
    ]
    continued = client.chat.completions.create(model="bubo", messages=messages, max_tokens=12, temperature=0)
    closed = client.chat.completions.create(
        model="bubo",
        messages=messages,
        max_tokens=12,
        temperature=0,
        extra_body={"continue_final_message": False},
    )
    assert continued.usage is not None
    assert closed.usage is not None
    assert closed.usage.prompt_tokens > continued.usage.prompt_tokens
    text = continued.choices[0].message.content or ""
    assert text.lstrip().startswith("4"), text
