"""OpenAI chat/completions/models wire models, fields in the API reference's order.

https://platform.openai.com/docs/api-reference/chat/create
https://platform.openai.com/docs/api-reference/completions/create
No logic here: :mod:`.translate` maps these to and from the domain.  Request
fields default to ``None`` so "not sent" is never confused with a default.
Extensions llama-server accepts (``top_k``, ``min_p``, ``repeat_penalty``, …)
sit after the official fields.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from bubo.api._usage import Timings, Usage

# ---- requests ------------------------------------------------------------------------------


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


ReasoningEffort = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]


@attrs.frozen(kw_only=True)
class StreamOptions:
    """``stream_options``."""

    include_usage: bool | None = None


@attrs.frozen(kw_only=True)
class ChatCompletionRequest:
    """``POST /v1/chat/completions``."""

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
    # llama-server extensions
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    thinking: ThinkingSwitch | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # transformers' / vLLM's render switches (None: a final assistant message is continued)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    grammar: str | None = None  # llama-server: GBNF for the whole answer
    json_schema: dict[str, Any] | None = None  # llama-server: a schema for the whole answer


@attrs.frozen(kw_only=True)
class CompletionRequest:
    """``POST /v1/completions``; ``prompt`` is text, token ids, or a list of one of them."""

    model: str | None = None
    prompt: str | list[int | str] | list[list[int]] | None = None
    echo: bool | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = None
    n: int | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # llama-server extensions
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None


# ---- responses -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TopLogprob:
    """An alternative token (``id`` is llama-server's addition)."""

    id: int
    token: str
    logprob: float
    bytes: list[int]


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """The sampled token and its alternatives."""

    id: int
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


@attrs.frozen(kw_only=True)
class ChoiceLogprobs:
    """``choices[].logprobs`` of a chat completion."""

    content: list[TokenLogprob]


@attrs.frozen(kw_only=True)
class CompletionLogprobs:
    """``choices[].logprobs`` of a legacy text completion."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


@attrs.frozen(kw_only=True)
class ToolCallOut:
    """A tool call the model made."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


@attrs.frozen(kw_only=True)
class AssistantMessage:
    """``choices[].message``; ``content`` is written even when null."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same text, for clients that read this name
    tool_calls: list[ToolCallOut] | None = None


@attrs.frozen(kw_only=True)
class Choice:
    """One chat completion choice."""

    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str


@attrs.frozen(kw_only=True)
class ChatCompletion:
    """A non-streaming chat completion."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[Choice]
    usage: Usage
    timings: Timings


@attrs.frozen(kw_only=True)
class ToolCallDelta:
    """A streamed tool call: id, type and name first, then argument fragments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


@attrs.frozen(kw_only=True)
class Delta:
    """What one chunk adds."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same text, for clients that read this name
    tool_calls: list[ToolCallDelta] | None = None


@attrs.frozen(kw_only=True)
class ChunkChoice:
    """One choice in a chunk; ``finish_reason`` is written even when null."""

    index: int
    delta: Delta
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


@attrs.frozen(kw_only=True)
class ChatCompletionChunk:
    """One streamed chunk."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    timings: Timings | None = None


@attrs.frozen(kw_only=True)
class CompletionChoice:
    """One text completion choice."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


@attrs.frozen(kw_only=True)
class TextCompletion:
    """A text completion, whole or one streamed chunk of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    timings: Timings | None = None


@attrs.frozen(kw_only=True)
class ModelMeta:
    """llama-server's ``meta`` block of a model entry."""

    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size: int
    vocab_type: int


@attrs.frozen(kw_only=True)
class Architecture:
    """What the model takes in."""

    input_modalities: list[str]


@attrs.frozen(kw_only=True)
class Model:
    """One ``/v1/models`` entry."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    context_length: int
    max_model_len: int
    meta: ModelMeta
    architecture: Architecture


@attrs.frozen(kw_only=True)
class ModelList:
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[Model]
