"""The OpenAI chat-completions request body, which three routes take.

https://platform.openai.com/docs/api-reference/chat/create
``/v1/chat/completions`` (the OpenAI dialect), llama-server's ``/apply-template``
(the llama.cpp dialect) and ``/debug/prompt`` read this body, so it lives beside
the dialects rather than in one of them.  No logic here: :mod:`.translate` maps it
to the domain.  Fields default to ``None`` so "not sent" is never confused with a
default.  Extensions llama-server accepts (``top_k``, ``min_p``, ``repeat_penalty``,
…) are inherited from :class:`~bubo.api._llama_fields.LlamaServerFields`, shared
with the completion routes.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from bubo.api._llama_fields import LlamaServerFields

__all__ = [
    "AudioPart",
    "ChatCompletionRequest",
    "ChatMessage",
    "ContentPart",
    "FilePart",
    "FunctionCall",
    "FunctionDefinition",
    "ImagePart",
    "ImageURL",
    "JsonSchemaFormat",
    "MessageToolCall",
    "NamedFunction",
    "NamedToolChoice",
    "ReasoningEffort",
    "ResponseFormat",
    "StreamOptions",
    "TextPart",
    "ThinkingSwitch",
    "Tool",
]


@attrs.frozen(kw_only=True)
class TextPart:
    """``{"type": "text", "text": …}``."""

    type: Literal["text"]
    text: str


@attrs.frozen(kw_only=True)
class ImageURL:
    """An image reference."""

    url: str
    detail: str | None = None


@attrs.frozen(kw_only=True)
class ImagePart:
    """``{"type": "image_url", "image_url": {"url": …}}``."""

    type: Literal["image_url"]
    image_url: ImageURL


@attrs.frozen(kw_only=True)
class AudioPart:
    """``{"type": "input_audio", …}``."""

    type: Literal["input_audio"]
    input_audio: dict[str, Any]


@attrs.frozen(kw_only=True)
class FilePart:
    """``{"type": "file", …}``."""

    type: Literal["file"]
    file: dict[str, Any]


ContentPart = TextPart | ImagePart | AudioPart | FilePart


@attrs.frozen(kw_only=True)
class FunctionCall:
    """A call's function name and JSON-text arguments."""

    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class MessageToolCall:
    """A tool call in an earlier assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


@attrs.frozen(kw_only=True)
class ChatMessage:
    """One input message; ``developer`` is OpenAI's newer name for ``system``.

    ``reasoning_content`` (llama.cpp, DeepSeek) and ``reasoning`` (OpenRouter,
    vLLM) carry an earlier assistant turn's thinking.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


@attrs.frozen(kw_only=True)
class FunctionDefinition:
    """A callable function and its JSON-schema parameters."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@attrs.frozen(kw_only=True)
class Tool:
    """``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionDefinition


@attrs.frozen(kw_only=True)
class NamedFunction:
    """The function a named tool choice forces."""

    name: str


@attrs.frozen(kw_only=True)
class NamedToolChoice:
    """``{"type": "function", "function": {"name": …}}``."""

    type: Literal["function"]
    function: NamedFunction


@attrs.frozen(kw_only=True)
class JsonSchemaFormat:
    """``response_format.json_schema``."""

    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


@attrs.frozen(kw_only=True)
class ResponseFormat:
    """``text``, ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema: dict[str, Any] | None = None  # llama-server: the schema beside the type


@attrs.frozen(kw_only=True)
class ThinkingSwitch:
    """``thinking``: ``{"type": "enabled"}`` or ``{"type": "disabled"}`` (optional ``budget_tokens``)."""

    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None


ReasoningEffort = Literal["none", "off", "minimal", "low", "medium", "high", "xhigh", "max"]


@attrs.frozen(kw_only=True)
class ChatCompletionRequest(LlamaServerFields):
    """``POST /v1/chat/completions``; also llama-server's ``/apply-template`` and ``/debug/prompt``."""

    messages: list[ChatMessage] | None = None
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    n: int | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: ReasoningEffort | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    user: str | None = None
    # llama-server's extensions (its samplers, grammar, json_schema, ignore_eos: LlamaServerFields)
    thinking: ThinkingSwitch | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # transformers' / vLLM's render switches (None: a final assistant message is continued)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    # llama-server: streamed prompt progress and per-chunk timings
    return_progress: bool | None = None
    timings_per_token: bool | None = None


@attrs.frozen(kw_only=True)
class StreamOptions:
    """``stream_options``."""

    include_usage: bool | None = None
