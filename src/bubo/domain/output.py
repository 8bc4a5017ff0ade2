"""The parsed output of a generation, as every dialect consumes it.

The service turns engine events into these (splitting reasoning and tool calls
out of the text); each dialect turns them into its own JSON or SSE shape.
"""

from __future__ import annotations

from typing import Literal

import attrs

from .generation import GenerationStats, PromptProgress, StopCause, TokenLogprob
from .messages import ToolCall

__all__ = [
    "Completion",
    "Done",
    "FinishReason",
    "OutputEvent",
    "PromptProgress",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallArgumentsDelta",
    "ToolCallStart",
    "finish_reason_for",
]

FinishReason = Literal["stop", "length", "tool_calls"]


def finish_reason_for(cause: StopCause, *, called_tools: bool) -> FinishReason:
    """The OpenAI-style finish reason for an engine stop cause."""
    if called_tools:
        return "tool_calls"
    return "length" if cause.truncated else "stop"


@attrs.frozen(kw_only=True)
class TextDelta:
    """Answer text and the tokens that produced it (``text`` may be empty while held back).

    ``logprobs`` covers those tokens when the request asked for them.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@attrs.frozen(kw_only=True)
class ReasoningDelta:
    """Thinking text, split out of the answer by the reasoning parser."""

    text: str


@attrs.frozen(kw_only=True)
class ToolCallStart:
    """The model began tool call number ``index``; its arguments follow as deltas."""

    index: int
    id: str
    name: str


@attrs.frozen(kw_only=True)
class ToolCallArgumentsDelta:
    """A fragment of the JSON arguments of tool call ``index``."""

    index: int
    fragment: str


@attrs.frozen(kw_only=True)
class Done:
    """The generation ended; always the last event."""

    finish_reason: FinishReason
    cause: StopCause
    stats: GenerationStats
    stop_word: str | None = None
    reasoning_tokens: int = 0


OutputEvent = PromptProgress | TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta | Done


@attrs.frozen(kw_only=True)
class Completion:
    """A whole generation, for non-streaming responses."""

    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    logprobs: tuple[TokenLogprob, ...]
    done: Done
