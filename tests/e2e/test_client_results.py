"""What the official SDKs read from a real server: whole characters, truncation after calls, the usage chunk.

The real model at temperature 0: it repeats an owl (three SmolLM2 tokens) that an
assistant prefill starts, and, forced to call a tool once, calls it and ends its turn.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anthropic
import openai
import pytest

from .conftest import Server, anthropic_client, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

OWL = "\N{OWL}"
OWLS = [{"role": "user", "content": "Draw owls."}, {"role": "assistant", "content": OWL * 8}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}
CITIES = [{"role": "user", "content": "Weather in Paris and Rome?"}]


def clients(server: Server, sdk: contextlib.ExitStack) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    return sdk.enter_context(openai_client(server)), sdk.enter_context(anthropic_client(server))


def test_a_limit_inside_a_character_finishes_it(server: Server, sdk: contextlib.ExitStack) -> None:
    """One token of a three-token owl: every dialect returns the whole owl, never U+FFFD."""
    oai, claude = clients(server, sdk)
    chunks = list(
        oai.completions.create(
            model="bubo", prompt=OWL * 12, max_tokens=1, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(choice.text for chunk in chunks for choice in chunk.choices) == OWL
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    chat = list(
        oai.chat.completions.create(model="bubo", messages=OWLS, max_tokens=1, temperature=0, stream=True)  # type: ignore[arg-type]
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chat) == OWL
    assert chat[-1].choices[0].finish_reason == "length"
    with claude.messages.stream(
        model="bubo", max_tokens=1, messages=OWLS, extra_body={"temperature": 0}
    ) as events:  # type: ignore[arg-type]
        message = events.get_final_message()
    assert ([block.text for block in message.content if block.type == "text"], message.stop_reason) == (
        [OWL],
        "max_tokens",
    )
    response = oai.responses.create(model="bubo", input=OWLS, max_output_tokens=1, temperature=0)  # type: ignore[arg-type]
    assert response.output_text == OWL
    assert (response.status, response.output[-1].status) == ("incomplete", "incomplete")


def test_completions_usage_comes_in_a_chunk_of_its_own(server: Server, sdk: contextlib.ExitStack) -> None:
    """include_usage: the finish reason on the last chunk with a choice, then usage with choices []."""
    oai, _ = clients(server, sdk)
    chunks = list(
        oai.completions.create(
            model="bubo", prompt="One, two, three,", max_tokens=4, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert (chunks[-1].choices, chunks[-1].usage is not None) == ([], True)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert {chunk.id[:5] for chunk in chunks} == {"cmpl-"}


def _chat(oai: openai.OpenAI, **limit: Any) -> openai.types.chat.ChatCompletion:
    return oai.chat.completions.create(  # type: ignore[call-overload, no-any-return]
        model="bubo", messages=CITIES, tools=[{"type": "function", "function": WEATHER}],
        tool_choice="required", parallel_tool_calls=False, temperature=0, **limit,
    )  # fmt: skip


def test_a_cut_after_the_calls_is_a_cut(server: Server, sdk: contextlib.ExitStack) -> None:
    """The same calls, one token short of the end of the turn: length / max_tokens / incomplete, calls kept."""
    oai, claude = clients(server, sdk)
    whole = _chat(oai)
    assert whole.choices[0].finish_reason == "tool_calls"
    calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    assert len(calls) == 1
    assert whole.usage is not None
    short = whole.usage.completion_tokens - 1  # everything but the end of the turn
    cut = _chat(oai, max_tokens=short)
    assert cut.choices[0].finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in cut.choices[0].message.tool_calls or []] == calls

    tool = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": SCHEMA}
    with claude.messages.stream(
        model="bubo", max_tokens=short, messages=CITIES, tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"temperature": 0},
    ) as events:  # fmt: skip
        message = events.get_final_message()
    assert message.stop_reason == "max_tokens"
    assert [block.type for block in message.content] == ["tool_use"]

    response = oai.responses.create(
        model="bubo", input=CITIES, tools=[{"type": "function", **WEATHER}],  # type: ignore[list-item]
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=short, stream=True,
    )  # fmt: skip
    final = [event for event in response if event.type in ("response.completed", "response.incomplete")]
    assert final[0].response.status == "incomplete"
    assert [item.type for item in final[0].response.output] == ["function_call"]
