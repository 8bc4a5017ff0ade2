"""OpenAI Responses wire models, fields in the API reference's order.

https://platform.openai.com/docs/api-reference/responses/create
``input`` items are a union tagged by ``type`` (:data:`InputItem`); a message
may omit its ``type``, so :class:`MessageItem` is the union's default.
``tools`` arrive as plain objects and are structured one by one in
:mod:`.translate`, because agents send tool types Bubo skips rather than rejects.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from bubo.api._llama_fields import LoraEntry

# ---- requests ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class InputText:
    """``input_text`` content."""

    type: Literal["input_text"]
    text: str


@attrs.frozen(kw_only=True)
class OutputTextIn:
    """``output_text`` content of an earlier assistant message."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None


@attrs.frozen(kw_only=True)
class RefusalIn:
    """A refusal in an earlier assistant message."""

    type: Literal["refusal"]
    refusal: str


@attrs.frozen(kw_only=True)
class InputImage:
    """An image; a text model rejects it."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


@attrs.frozen(kw_only=True)
class InputFile:
    """A file; a text model rejects it."""

    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None


InputContent = InputText | OutputTextIn | RefusalIn | InputImage | InputFile


@attrs.frozen(kw_only=True)
class MessageItem:
    """A message: the SDK's easy input message, input message or output message; ``type`` may be omitted."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputContent]
    type: Literal["message"] | None = None
    id: str | None = None
    status: str | None = None


@attrs.frozen(kw_only=True)
class FunctionCallItem:
    """A function call the model made in an earlier turn."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None  # the namespace tool the function belongs to
    id: str | None = None
    status: str | None = None


@attrs.frozen(kw_only=True)
class FunctionCallOutputItem:
    """The result of a function call."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputContent]
    id: str | None = None
    status: str | None = None


@attrs.frozen(kw_only=True)
class CustomToolCallItem:
    """A call of a custom (freeform) tool in an earlier turn."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None


@attrs.frozen(kw_only=True)
class CustomToolCallOutputItem:
    """The result of a custom tool call."""

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[InputContent]
    id: str | None = None


@attrs.frozen(kw_only=True)
class ReasoningPart:
    """``summary_text`` or ``reasoning_text``."""

    type: Literal["summary_text", "reasoning_text"]
    text: str


@attrs.frozen(kw_only=True)
class ReasoningItem:
    """Reasoning from an earlier turn; ``encrypted_content`` is opaque and dropped."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] | None = None
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None
    status: str | None = None


@attrs.frozen(kw_only=True)
class AdditionalToolsItem:
    """``{"type": "additional_tools", "tools": […]}``: tools offered from this point of the input (Codex)."""

    type: Literal["additional_tools"]
    tools: list[dict[str, Any]]
    role: str | None = None
    id: str | None = None


@attrs.frozen(kw_only=True)
class OtherItem:
    """An input item of a type Bubo does not know (a hosted tool's call, a compaction): skipped."""

    type: str
    id: str | None = None


@attrs.frozen(kw_only=True)
class ItemReference:
    """An earlier item named by its ``id``; Bubo keeps no items by id and refuses it."""

    type: Literal["item_reference"]
    id: str


InputItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ReasoningItem
    | ItemReference
    | AdditionalToolsItem
    | OtherItem
)


@attrs.frozen(kw_only=True)
class FunctionTool:
    """``{"type": "function", "name", "description", "parameters", "strict"}`` (not nested)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@attrs.frozen(kw_only=True)
class NamespaceTool:
    """``{"type": "namespace", "name", "description", "tools": [functions]}`` (Codex's sub-agent tools)."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[dict[str, Any]] | None = None


@attrs.frozen(kw_only=True)
class CustomTool:
    """``{"type": "custom", "name", "description", "format"}``: a freeform tool taking one string.

    ``format`` is ``{"type": "text"}`` or a grammar (``{"type": "grammar", "syntax": "lark", …}``).
    """

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ReasoningConfig:
    """``reasoning``: ``effort`` and ``summary``."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


@attrs.frozen(kw_only=True)
class TextConfig:
    """``text``: the output ``format`` (and ``verbosity``)."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


@attrs.frozen(kw_only=True)
class ResponsesRequest:
    """``POST /v1/responses``."""

    model: str | None = None
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    store: bool | None = None
    stream: bool | None = None
    temperature: float | None = None
    text: TextConfig | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_p: float | None = None
    truncation: str | None = None
    user: str | None = None
    lora: list[LoraEntry] | None = None  # llama-server's: this request's LoRA adapter scales
    return_progress: bool | None = None  # llama-server's: prompt_progress on response.in_progress events
    timings_per_token: bool | None = None  # llama-server's: the timings so far on every delta event


# ---- responses -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ReasoningText:
    """Reasoning content of an output item."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


@attrs.frozen(kw_only=True)
class ReasoningOut:
    """A ``reasoning`` output item (Bubo's models think in plain text: no summary)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any]
    content: list[ReasoningText]
    status: str


@attrs.frozen(kw_only=True)
class OutputText:
    """``output_text`` content."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any]
    logprobs: list[Any]


@attrs.frozen(kw_only=True)
class MessageOut:
    """A ``message`` output item."""

    type: Literal["message"] = "message"
    id: str
    status: str
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


@attrs.frozen(kw_only=True)
class FunctionCallOut:
    """A ``function_call`` output item (``namespace`` for a function of a namespace tool)."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    namespace: str | None = None


@attrs.frozen(kw_only=True)
class CustomToolCallOut:
    """A ``custom_tool_call`` output item: a freeform tool's call, its ``input`` one string."""

    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: str
    namespace: str | None = None


OutputItem = ReasoningOut | MessageOut | FunctionCallOut | CustomToolCallOut


@attrs.frozen(kw_only=True)
class InputTokensDetails:
    """Prompt tokens reused from the cache.

    ``cache_write_tokens`` is always 0: keeping a prefix costs nothing extra
    (the same as Anthropic's ``cache_creation_input_tokens``).
    """

    cached_tokens: int
    shared_tokens: int = 0  # of cached_tokens, those taken from another slot's cells
    cache_write_tokens: int = 0


@attrs.frozen(kw_only=True)
class OutputTokensDetails:
    """Reasoning tokens among the output tokens."""

    reasoning_tokens: int


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


@attrs.frozen(kw_only=True)
class IncompleteDetails:
    """Why a response is incomplete."""

    reason: str


@attrs.frozen(kw_only=True)
class Response:
    """A response object (also inside ``response.created`` … ``response.completed`` events)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    error: dict[str, Any] | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig
    store: bool
    temperature: float | None
    text: TextConfig
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: str
    usage: Usage | None
    metadata: dict[str, str]


@attrs.frozen(kw_only=True)
class Deleted:
    """``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool
