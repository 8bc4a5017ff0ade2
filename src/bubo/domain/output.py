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
    "OutputPart",
    "PromptProgress",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallArgumentsDelta",
    "ToolCallStart",
    "finish_reason_for",
]

FinishReason = Literal["stop", "length", "tool_calls"]


def finish_reason_for(cause: StopCause, *, called_tools: bool) -> FinishReason:
    """The OpenAI-style finish reason for an engine stop cause.

    Truncation wins over calls, as in llama-server: calls parsed before the
    limit are returned, but the turn did not end with them.
    """
    if cause.truncated:
        return "length"
    return "tool_calls" if called_tools else "stop"


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
    """Thinking text, split out of the answer by the reasoning parser (and the tokens that produced it)."""

    text: str
    token_ids: tuple[int, ...] = ()


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
    raw_text: str = ""  # the text the model generated, before the reasoning and tool-call parsers


OutputEvent = PromptProgress | TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta | Done


OutputPart = ReasoningDelta | TextDelta | ToolCall


@attrs.frozen(kw_only=True)
class Completion:
    """A whole generation, for non-streaming responses.

    ``parts`` is the output in the order it was generated, as a stream delivers
    it: each run of reasoning or answer text (non-empty, joined) and each call.
    """

    parts: tuple[OutputPart, ...]
    logprobs: tuple[TokenLogprob, ...]
    done: Done
    token_ids: tuple[int, ...] = ()  # the answer's tokens (those of its text deltas)

    @property
    def text(self) -> str:
        """All the answer text."""
        return "".join(part.text for part in self.parts if isinstance(part, TextDelta))

    @property
    def reasoning(self) -> str:
        """All the reasoning text."""
        return "".join(part.text for part in self.parts if isinstance(part, ReasoningDelta))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls, in order."""
        return tuple(part for part in self.parts if isinstance(part, ToolCall))
