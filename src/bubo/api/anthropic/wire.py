"""Anthropic Messages wire models, fields in the API reference's order.

https://docs.anthropic.com/en/api/messages
https://docs.anthropic.com/en/api/messages-count-tokens
No logic here: :mod:`.translate` maps these to and from the domain.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from bubo.api._llama_fields import LoraEntry

# ---- requests ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TextBlock:
    """``{"type": "text", "text": …}``; ``cache_control`` and ``citations`` are accepted and ignored."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ImageBlock:
    """An image: read from a base64 ``source`` by a model that takes images, else a placeholder.

    A text model refuses it in the newest user turn.  ``source`` is checked in
    :mod:`.translate`, only where the image is read.
    """

    type: Literal["image"]
    source: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class DocumentBlock:
    """A document: a text source is read as text, a PDF or URL becomes a placeholder."""

    type: Literal["document"]
    source: dict[str, Any] | None = None
    title: str | None = None
    context: str | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolReferenceBlock:
    """``{"type": "tool_reference", "tool_name": …}``: a tool search's result, loading a deferred tool."""

    type: Literal["tool_reference"]
    tool_name: str


@attrs.frozen(kw_only=True)
class SearchResultBlock:
    """A search result a client tool returned: its source, title and text content."""

    type: Literal["search_result"]
    source: str | None = None
    title: str | None = None
    content: list[TextBlock] | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class OtherBlock:
    """A block of a type Bubo does not know (server tools' blocks, newer types): read as text.

    Its fields are kept as sent, whatever their shape; :mod:`.translate` shows
    the ones that hold text.
    """

    type: str
    text: Any = None
    content: Any = None
    name: Any = None
    input: Any = None
    title: Any = None
    source: Any = None


ResultBlock = TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock | SearchResultBlock | OtherBlock


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
    content: str | list[ResultBlock] | None = None
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
    | ToolReferenceBlock
    | SearchResultBlock
    | OtherBlock
)


@attrs.frozen(kw_only=True)
class InputMessage:
    """One turn: ``user``, ``assistant`` or ``system`` (Claude Code sends system turns mid-conversation)."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


@attrs.frozen(kw_only=True)
class Tool:
    """A client tool; ``type`` is absent or ``custom`` (server tools carry other types).

    ``defer_loading`` tools are not shown to the model until a ``tool_reference``
    in the conversation loads them (Anthropic's tool search).
    """

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    defer_loading: bool | None = None
    cache_control: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolChoice:
    """``auto``, ``any``, ``tool`` (with ``name``) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


@attrs.frozen(kw_only=True)
class ThinkingConfig:
    """``enabled`` (with ``budget_tokens``), ``adaptive``, ``between_tools`` or ``disabled``.

    ``display`` (``summarized``, ``omitted``) says how Anthropic shows thinking;
    Bubo streams the model's thinking as it is.  A newer ``type`` keeps the
    template's default.
    """

    type: str
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
    effort: str | None = None


@attrs.frozen(kw_only=True)
class ContextEdit:
    """One ``context_management`` edit: ``clear_thinking_20251015`` (with ``keep``) is applied."""

    type: str
    keep: str | dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ContextManagement:
    """``context_management``: edits the server applies to the history before the model reads it."""

    edits: list[ContextEdit] | None = None


@attrs.frozen(kw_only=True)
class MessagesRequest:
    """``POST /v1/messages``; ``max_tokens`` is required, as in Anthropic's API."""

    model: str | None = None
    messages: list[InputMessage] | None = None
    max_tokens: int
    system: str | list[TextBlock] | None = None
    metadata: dict[str, Any] | None = None  # accepted, not used (Claude Code's user_id is JSON text)
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    lora: list[LoraEntry] | None = None  # llama-server's: this request's LoRA adapter scales


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
    context_management: ContextManagement | None = None
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
