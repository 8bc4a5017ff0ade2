"""OpenAI completions and models wire models, and chat's answers, fields in the API reference's order.

https://platform.openai.com/docs/api-reference/completions/create
The chat-completions request body is shared with other routes: :mod:`bubo.api._chat.wire`.
No logic here: :mod:`.translate` maps these to and from the domain.  Request
fields default to ``None`` so "not sent" is never confused with a default.
Extensions llama-server accepts (``top_k``, ``min_p``, ``repeat_penalty``, …)
sit after the official fields.
"""

from __future__ import annotations

from typing import Literal

import attrs

from bubo.api._chat.wire import FunctionCall, StreamOptions
from bubo.api._llama_fields import LlamaServerFields
from bubo.api._progress import Progress
from bubo.api._usage import Timings, Usage

# ---- requests ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CompletionRequest(LlamaServerFields):
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
    # llama-server's extensions: LlamaServerFields


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
    """What one chunk after the first adds."""

    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same text, for clients that read this name
    tool_calls: list[ToolCallDelta] | None = None


@attrs.frozen(kw_only=True)
class RoleDelta:
    """The first chunk's delta: the role and ``"content": null``, as llama-server sends it."""

    role: Literal["assistant"] = "assistant"
    # A Factory default, not ``None``, so the null is written rather than left out (see ``_json``).
    content: None = attrs.field(default=attrs.Factory(lambda: None))


@attrs.frozen(kw_only=True)
class ChunkChoice:
    """One choice in a chunk; ``finish_reason`` is written even when null."""

    index: int
    delta: Delta | RoleDelta
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
    prompt_progress: Progress | None = None  # llama-server's return_progress


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
    aliases: list[str]  # the model's names (--alias / --served-model-name), as llama-server lists them
    tags: list[str]  # informational (--tags)
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    context_length: int
    max_model_len: int
    meta: ModelMeta
    architecture: Architecture


@attrs.frozen(kw_only=True)
class ModelDetails:
    """A ``models`` entry's ``details``: the file's format."""

    format: Literal["gguf"] = "gguf"


@attrs.frozen(kw_only=True)
class ListedModel:
    """One entry of llama-server's ``models`` beside ``data`` (its web UI reads the ``capabilities``)."""

    name: str
    model: str
    type: Literal["model"] = "model"
    capabilities: list[str]
    details: ModelDetails = ModelDetails()


@attrs.frozen(kw_only=True)
class ModelList:
    """``GET /v1/models``: OpenAI's ``data``, and llama-server's ``models`` beside it."""

    models: list[ListedModel]
    object: Literal["list"] = "list"
    data: list[Model]


@attrs.frozen(kw_only=True)
class InputTokens:
    """``POST /v1/chat/completions/input_tokens``: llama-server's count of a chat request's prompt."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
