"""Anthropic Messages wire models, fields in the API reference's order.

https://docs.anthropic.com/en/api/messages
https://docs.anthropic.com/en/api/messages-count-tokens
No logic here: :mod:`.translate` maps these to and from the domain.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

# ---- requests ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TextBlock:
    """``{"type": "text", "text": …}``; ``cache_control`` and ``citations`` are accepted and ignored."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ImageBlock:
    """An image; a text model rejects it."""

    type: Literal["image"]
    source: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class DocumentBlock:
    """A document (PDF, text source); rejected on a text model."""

    type: Literal["document"]
    source: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolUseBlock:
    """A tool call in an earlier assistant turn."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolResultBlock:
    """A tool's result, sent back in a user turn."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ThinkingBlock:
    """Thinking from an earlier assistant turn; the signature is opaque to Bubo."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


@attrs.frozen(kw_only=True)
class RedactedThinkingBlock:
    """Encrypted thinking from Anthropic's own models; it carries nothing Bubo can read."""

    type: Literal["redacted_thinking"]
    data: str | None = None


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


@attrs.frozen(kw_only=True)
class InputMessage:
    """One turn: ``user`` or ``assistant``, a string or content blocks."""

    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


@attrs.frozen(kw_only=True)
class Tool:
    """A client tool; ``type`` is absent or ``custom`` (server tools carry other types)."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolChoice:
    """``auto``, ``any``, ``tool`` (with ``name``) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


@attrs.frozen(kw_only=True)
class ThinkingConfig:
    """``enabled`` (with ``budget_tokens``), ``adaptive``, ``between_tools`` or ``disabled``."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None
    display: str | None = None


@attrs.frozen(kw_only=True)
class OutputFormat:
    """``{"type": "json_schema", "schema": {...}}``."""

    type: Literal["json_schema"]
    schema: dict[str, Any]


@attrs.frozen(kw_only=True)
class OutputConfig:
    """``output_config``: a structured ``format`` and an ``effort`` level."""

    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


@attrs.frozen(kw_only=True)
class Metadata:
    """Request metadata (accepted, not used)."""

    user_id: str | None = None


@attrs.frozen(kw_only=True)
class MessagesRequest:
    """``POST /v1/messages``; ``max_tokens`` is required, as in Anthropic's API."""

    model: str | None = None
    messages: list[InputMessage] | None = None
    max_tokens: int
    system: str | list[TextBlock] | None = None
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


@attrs.frozen(kw_only=True)
class CountTokensRequest:
    """``POST /v1/messages/count_tokens``: a Messages request without generation fields."""

    model: str | None = None
    messages: list[InputMessage] | None = None
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    stream: bool | None = None


# ---- responses -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TextOut:
    """A text content block."""

    type: Literal["text"] = "text"
    text: str


@attrs.frozen(kw_only=True)
class ThinkingOut:
    """A thinking content block (the signature is empty: Bubo signs nothing)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


@attrs.frozen(kw_only=True)
class ToolUseOut:
    """A tool call."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts; ``input_tokens`` excludes those read from the cache, as in Anthropic's API."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


@attrs.frozen(kw_only=True)
class Message:
    """A whole message (also the ``message`` of ``message_start``)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextOut | ThinkingOut | ToolUseOut]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage


@attrs.frozen(kw_only=True)
class TokenCount:
    """``count_tokens`` response."""

    input_tokens: int


@attrs.frozen(kw_only=True)
class ErrorDetail:
    """The ``error`` object, with Bubo's stable ``code``."""

    type: str
    message: str
    code: str


@attrs.frozen(kw_only=True)
class ErrorEnvelope:
    """``{"type": "error", "error": {...}, "request_id": …}``."""

    type: Literal["error"] = "error"
    error: ErrorDetail
    request_id: str
