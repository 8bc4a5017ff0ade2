"""Ollama's native API wire models, fields in the order of Ollama's ``api/types.go``.

https://github.com/ollama/ollama/blob/main/docs/api.md
No logic here: :mod:`.translate` maps these to and from the domain.  Request
fields default to ``None`` so "not sent" is never confused with a default.
``options`` is a free-form object, as in Ollama: its known keys are checked one
by one in :mod:`.translate` (an unknown key is ignored, as Ollama ignores it).
Response fields that Ollama omits when empty default to ``None`` (left out).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

# ---- requests ------------------------------------------------------------------------------

Think = bool | Literal["low", "medium", "high", "max"]


@attrs.frozen(kw_only=True)
class ToolCallFunction:
    """A call's function: ``arguments`` is a JSON object, not text (Ollama's form)."""

    index: int | None = None
    name: str
    arguments: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolCall:
    """A tool call in an earlier assistant message; ``id`` is optional."""

    id: str | None = None
    function: ToolCallFunction


@attrs.frozen(kw_only=True)
class Message:
    """One chat message; ``role`` is read case-insensitively, as Ollama does."""

    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


@attrs.frozen(kw_only=True)
class ToolFunction:
    """A function the model may call, with its JSON-schema ``parameters``."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class Tool:
    """``{"type": "function", "function": {...}}``."""

    type: str | None = None
    items: Any = None
    function: ToolFunction


@attrs.frozen(kw_only=True)
class ChatRequest:
    """``POST /api/chat``."""

    model: str | None = None
    messages: list[Message] | None = None
    stream: bool | None = None
    format: Any = None  # "json", "" or a JSON schema (checked in translate)
    keep_alive: Any = None  # seconds, or a Go duration string (checked in translate)
    tools: list[Tool] | None = None
    options: dict[str, Any] | None = None
    think: Think | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


@attrs.frozen(kw_only=True)
class GenerateRequest:
    """``POST /api/generate``."""

    model: str | None = None
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool | None = None
    raw: bool | None = None
    format: Any = None
    keep_alive: Any = None
    images: list[str] | None = None
    options: dict[str, Any] | None = None
    think: Think | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


@attrs.frozen(kw_only=True)
class EmbedRequest:
    """``POST /api/embed``; ``input`` is a string or a list of strings (checked in the route)."""

    model: str | None = None
    input: Any = None
    keep_alive: Any = None
    truncate: bool | None = None
    dimensions: int | None = None
    options: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class EmbeddingsRequest:
    """``POST /api/embeddings``, the older form: one ``prompt``."""

    model: str | None = None
    prompt: str | None = None
    keep_alive: Any = None
    options: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ShowRequest:
    """``POST /api/show``; ``name`` is the older spelling of ``model``."""

    model: str | None = None
    system: str | None = None
    template: str | None = None
    verbose: bool | None = None
    options: dict[str, Any] | None = None
    name: str | None = None


@attrs.frozen(kw_only=True)
class PullRequest:
    """``POST /api/pull``; ``insecure``, ``username`` and ``password`` are ignored, as Ollama ignores them."""

    model: str | None = None
    insecure: bool | None = None
    username: str | None = None
    password: str | None = None
    stream: bool | None = None
    name: str | None = None


# ---- responses -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CallFunctionOut:
    """A call's function as Ollama writes it: ``index`` always, ``arguments`` an object."""

    index: int
    name: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class ToolCallOut:
    """A tool call the model made."""

    id: str
    function: CallFunctionOut


@attrs.frozen(kw_only=True)
class TopLogprob:
    """An alternative token."""

    token: str
    logprob: float
    bytes: list[int]


@attrs.frozen(kw_only=True)
class Logprob:
    """A generated token's log-probability and, when asked for, its alternatives."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob] | None = None


@attrs.frozen(kw_only=True)
class MessageOut:
    """``message`` of a chat answer: ``content`` is always written, empty when there is none."""

    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None
    tool_calls: list[ToolCallOut] | None = None


@attrs.frozen(kw_only=True)
class ChatResponse:
    """One ``/api/chat`` chunk, or the whole answer; the metrics only when ``done``."""

    model: str
    created_at: str
    message: MessageOut
    done: bool
    done_reason: str | None = None
    logprobs: list[Logprob] | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


@attrs.frozen(kw_only=True)
class GenerateResponse:
    """One ``/api/generate`` chunk, or the whole answer; ``context`` and the metrics only when ``done``."""

    model: str
    created_at: str
    response: str
    thinking: str | None = None
    done: bool
    done_reason: str | None = None
    context: list[int] | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    logprobs: list[Logprob] | None = None


@attrs.frozen(kw_only=True)
class EmbedResponse:
    """``/api/embed``: one unit-length vector per input."""

    model: str
    embeddings: list[list[float]]
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None


@attrs.frozen(kw_only=True)
class EmbeddingResponse:
    """``/api/embeddings``."""

    embedding: list[float]


@attrs.frozen(kw_only=True)
class ModelDetails:
    """``details`` of a model entry (``parent_model`` is always empty: Bubo's models have none)."""

    parent_model: str = ""
    format: Literal["gguf"] = "gguf"
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


@attrs.frozen(kw_only=True)
class ListedModel:
    """One ``/api/tags`` entry; ``name`` equals ``model``."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails
    context_length: int | None = None


@attrs.frozen(kw_only=True)
class ListResponse:
    """``GET /api/tags``."""

    models: list[ListedModel]


@attrs.frozen(kw_only=True)
class RunningModel:
    """One ``/api/ps`` entry."""

    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int


@attrs.frozen(kw_only=True)
class ProcessResponse:
    """``GET /api/ps``."""

    models: list[RunningModel]


@attrs.frozen(kw_only=True)
class ShowResponse:
    """``POST /api/show``; ``model_info`` and ``license`` (empty when the file has none) always present."""

    license: str
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


@attrs.frozen(kw_only=True)
class Progress:
    """A ``/api/pull`` progress line."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


@attrs.frozen(kw_only=True)
class Version:
    """``GET /api/version``."""

    version: str


@attrs.frozen(kw_only=True)
class ErrorBody:
    """Ollama's error: ``{"error": "..."}``."""

    error: str
