"""Responses wire ↔ domain: input items down, output items up."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs
import cattrs

from bubo.api._images import ImageCollector, marked
from bubo.api._json import dumps
from bubo.api._llama_fields import lora_scales
from bubo.api._nesting import check_arguments_depth
from bubo.api._numbers import check_token_limit, checked_sampling
from bubo.api._omitted import Omissions
from bubo.domain.ids import new_id
from bubo.domain.messages import ChatPrompt, Message, ToolCall
from bubo.domain.output import Completion, Done, ReasoningDelta, TextDelta
from bubo.domain.requests import ChatRequest, GenerationOptions, OutputFormat, ReasoningControl, ToolChoice
from bubo.errors import InvalidRequest, UnsupportedContent

from . import wire
from .tools import CUSTOM_INPUT, OfferedTools, custom_input, offered_tools

__all__ = [
    "CUSTOM_INPUT",
    "IMAGE_NOT_KEPT",
    "Conversation",
    "OfferedTools",
    "answered",
    "assistant_message",
    "closing_status",
    "custom_input",
    "function_call_item",
    "message_item",
    "output_items",
    "reasoning_item",
    "response",
    "responses_request",
    "usage",
]

logger = logging.getLogger(__name__)

_EMPTY_SCHEMA = {"type": "object", "properties": {}}


@attrs.frozen(kw_only=True)
class Conversation:
    """A request's conversation: what is sent to the template and what a continuation keeps.

    ``history`` excludes ``instructions``, which (as in OpenAI's API) do not
    carry over to a response that continues this one, and holds no image: the
    store keeps text, so each image of this request is a placeholder there
    (:data:`IMAGE_NOT_KEPT`) for the continuations that read it.
    """

    request: ChatRequest
    history: tuple[Message, ...]
    tools: OfferedTools = attrs.field(factory=OfferedTools)


IMAGE_NOT_KEPT = "[image: sent with an earlier response and not kept for its continuations]"
"""What a continuation reads where an earlier request of the conversation sent an image."""


def responses_request(
    converter: cattrs.Converter,
    body: wire.ResponsesRequest,
    previous: Sequence[Message],
    *,
    takes_images: bool = False,
) -> Conversation:
    """The domain request for ``POST /v1/responses``, continuing *previous* turns.

    *takes_images*: the model reads ``input_image`` parts (``image_url`` as a
    ``data:`` URI); else each is a placeholder, or a 400 in the newest user message.

    Raises:
        InvalidRequest: no input, an item reference, unsupported content, an image by URL or file id,
            ``max_output_tokens`` below 1 or over 32 bits, a sampler setting out of range.

    """
    if not body.input:
        raise InvalidRequest("input is required", code="missing_input", param="input")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise InvalidRequest("max_output_tokens must be at least 1", param="max_output_tokens")
    check_token_limit(body.max_output_tokens, "max_output_tokens")
    omissions = Omissions()
    images = ImageCollector(omissions, takes_images=takes_images)
    items = (
        [Message(role="user", content=body.input)]
        if isinstance(body.input, str)
        else _messages(body.input, omissions, images)
    )
    history = (*previous, *marked(tuple(items), images.marker, IMAGE_NOT_KEPT))
    system = (Message(role="system", content=body.instructions),) if body.instructions else ()
    items_tools = [
        (f"input[{index}].tools", item.tools)
        for index, item in enumerate(body.input if isinstance(body.input, list) else ())
        if isinstance(item, wire.AdditionalToolsItem)
    ]
    tools = offered_tools(converter, [("tools", body.tools or ()), *items_tools])
    request = ChatRequest(
        prompt=ChatPrompt(
            messages=(*system, *previous, *items),
            tools=tools.specs,
            images=images.images,
            media_marker=images.marker,
        ),
        options=GenerationOptions(
            max_tokens=body.max_output_tokens,
            sampling=checked_sampling(temperature=body.temperature, top_p=body.top_p),
            lora=lora_scales(body.lora),
        ),
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        reasoning=_reasoning(body.reasoning),
        output_format=_output_format(body.text),
        omitted=omissions.counts(),
    )
    return Conversation(request=request, history=history, tools=tools)


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice:
    """``none``/``auto``/``required`` or ``{"type": "function" | "custom", "name": …}``."""
    if choice is None:
        return ToolChoice()
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequest(f"tool_choice {choice!r} is not none, auto or required", param="tool_choice")
        return ToolChoice(mode=choice)  # type: ignore[arg-type]
    name = choice.get("name")
    if choice.get("type") not in ("function", "custom") or not isinstance(name, str):
        raise InvalidRequest(
            'tool_choice must name a tool as {"type": "function" | "custom", "name": …}',
            param="tool_choice",
        )
    return ToolChoice(mode="named", name=name, param="tool_choice.name")


_EFFORTS = frozenset({"none", "off", "minimal", "low", "medium", "high", "xhigh", "max"})


def _reasoning(config: wire.ReasoningConfig | None) -> ReasoningControl:
    effort = config.effort if config is not None else None
    if effort is not None and effort not in _EFFORTS:
        raise InvalidRequest(
            f"reasoning.effort {effort!r} is not one of {', '.join(sorted(_EFFORTS))}",
            param="reasoning.effort",
        )
    return ReasoningControl.from_effort(effort)


def _output_format(text: wire.TextConfig | None) -> OutputFormat | None:
    spec = text.format if text is not None else None
    if not spec or spec.get("type") == "text":
        return None
    if spec.get("type") == "json_object":
        return OutputFormat(schema={"type": "object"}, param="text.format")
    if spec.get("type") == "json_schema":
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest("text.format json_schema needs a schema object", param="text.format.schema")
        return OutputFormat(schema=schema, param="text.format.schema")
    raise InvalidRequest(f"text.format type {spec.get('type')!r} is not supported", param="text.format.type")


def _messages(items: Sequence[wire.InputItem], omissions: Omissions, images: ImageCollector) -> list[Message]:
    out = _Turns()
    reasoning: list[str] = []
    newest_user = max(
        (i for i, item in enumerate(items) if isinstance(item, wire.MessageItem) and item.role == "user"),
        default=-1,
    )
    for index, item in enumerate(items):
        match item:
            case wire.ReasoningItem():
                reasoning.extend(part.text for part in (item.content or item.summary or ()))
            case wire.MessageItem():
                role = "system" if item.role == "developer" else item.role
                text = _text(
                    item.content, f"input[{index}].content", omissions, images, refuse=index == newest_user
                )
                if role == "assistant":
                    out.add_assistant(reasoning, text=text)
                else:
                    out.add(Message(role=role, content=text))
            case wire.FunctionCallItem() | wire.CustomToolCallItem():
                out.add_assistant(reasoning, call=_call(item, f"input[{index}]"))
            case wire.FunctionCallOutputItem() | wire.CustomToolCallOutputItem():
                output = _text(item.output, f"input[{index}].output", omissions, images, refuse=False)
                out.add(Message(role="tool", content=output, tool_call_id=item.call_id))
            case wire.AdditionalToolsItem():
                pass  # offered with the request's tools
            case wire.OtherItem(type=kind):
                logger.warning("skipping input[%d] of type %r: Bubo does not know it", index, kind)
            case wire.ItemReference():
                raise InvalidRequest(
                    "item references are not supported: Bubo keeps no items by id; "
                    "send the item itself, or continue a stored response with previous_response_id",
                    param=f"input[{index}].id",
                )
    return out.messages()


def _call(item: wire.FunctionCallItem | wire.CustomToolCallItem, param: str) -> ToolCall:
    """An earlier call; a custom tool's as the model writes it, its one string argument as ``input``."""
    if isinstance(item, wire.FunctionCallItem):
        arguments = check_arguments_depth(item.arguments, f"{param}.arguments")
    else:
        arguments = dumps({CUSTOM_INPUT: item.input})
    return ToolCall(id=item.call_id, name=item.name, arguments=arguments)


@attrs.define
class _AssistantTurn:
    """Consecutive assistant items: each one's text and reasoning (None: none), and the calls."""

    texts: list[str | None] = attrs.Factory(list)
    reasonings: list[str | None] = attrs.Factory(list)
    calls: list[ToolCall] = attrs.Factory(list)

    def message(self) -> Message:
        return Message(
            role="assistant",
            content=_joined(self.texts),
            reasoning=_joined(self.reasonings),
            tool_calls=tuple(self.calls),
        )


class _Turns:
    """The conversation's turns as the items come.

    Consecutive assistant items (reasoning, text, calls) fold into one assistant
    turn, built once it ends; text after calls starts another.  Merging each
    item into the turn so far copied its text and calls every time: n² in a run
    of items a request may send by the thousand.
    """

    def __init__(self) -> None:
        self._out: list[Message] = []
        self._turn: _AssistantTurn | None = None

    def add(self, message: Message) -> None:
        self._close()
        self._out.append(message)

    def add_assistant(
        self, reasoning: list[str], *, text: str | None = None, call: ToolCall | None = None
    ) -> None:
        """An assistant item, with the reasoning items before it (taken out of *reasoning*)."""
        if self._turn is None or (call is None and self._turn.calls):
            self._close()
            self._turn = _AssistantTurn()
        self._turn.texts.append(text)
        self._turn.reasonings.append("\n".join(reasoning) or None)
        if call is not None:
            self._turn.calls.append(call)
        reasoning.clear()

    def messages(self) -> list[Message]:
        self._close()
        return self._out

    def _close(self) -> None:
        if self._turn is not None:
            self._out.append(self._turn.message())
            self._turn = None


def _joined(values: list[str | None]) -> str | None:
    """The non-empty values, one a line; the last value when none is (as folding them two by two gave)."""
    present = [value for value in values if value]
    return "\n".join(present) if present else values[-1]


def _text(
    content: str | list[wire.InputContent],
    param: str,
    omissions: Omissions,
    images: ImageCollector,
    *,
    refuse: bool,
) -> str:
    """The text of a message or an output, its images at their markers (a model that takes them).

    An image for a text model, or a file, is a placeholder, or (with *refuse*) a 400.
    """
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        match part:
            case wire.InputText(text=text) | wire.OutputTextIn(text=text):
                texts.append(text)
            case wire.RefusalIn(refusal=text):
                texts.append(text)
            case wire.InputImage():
                texts.append(_image(part, f"{param}[{index}]", images, refuse=refuse))
            case _ if refuse:
                raise UnsupportedContent(part.type, param=f"{param}[{index}]")
            case wire.InputFile():
                texts.append(omissions.placeholder("file"))
    return "\n".join(texts)


def _image(part: wire.InputImage, param: str, images: ImageCollector, *, refuse: bool) -> str:
    """An ``input_image``: its ``image_url`` must be a ``data:`` URI (nothing is fetched, no file is kept)."""
    if images.takes_images:
        if part.image_url is None and part.file_id is not None:
            raise InvalidRequest(
                "an input_image by file_id is not supported: this server keeps no files; "
                "send the image's bytes as a data: URI in image_url",
                code="image_url_not_supported",
                param=f"{param}.file_id",
            )
        if part.image_url is None:
            raise InvalidRequest("an input_image needs image_url (a data: URI)", param=f"{param}.image_url")
    return images.data_uri(part.image_url or "", param, field=".image_url", refuse=refuse)


# ---- output --------------------------------------------------------------------------------


def reasoning_item(item_id: str, text: str, status: str = "completed") -> wire.ReasoningOut:
    """A reasoning output item."""
    return wire.ReasoningOut(
        id=item_id, summary=[], content=[wire.ReasoningText(text=text)] if text else [], status=status
    )


def message_item(item_id: str, text: str, status: str = "completed") -> wire.MessageOut:
    """A message output item (its text is empty while in progress)."""
    content = [wire.OutputText(text=text, annotations=[], logprobs=[])] if status != "in_progress" else []
    return wire.MessageOut(id=item_id, status=status, content=content)


def function_call_item(
    item_id: str, call: ToolCall, tools: OfferedTools, status: str = "completed"
) -> wire.FunctionCallOut | wire.CustomToolCallOut:
    """A call's output item: ``custom_tool_call`` for a custom tool, else ``function_call``."""
    if call.name in tools.custom:
        return wire.CustomToolCallOut(
            id=item_id,
            call_id=call.id,
            name=call.name,
            input=custom_input(call.arguments),
            status=status,
            namespace=tools.namespaces.get(call.name),
        )
    return wire.FunctionCallOut(
        id=item_id,
        call_id=call.id,
        name=call.name,
        arguments=call.arguments,
        status=status,
        namespace=tools.namespaces.get(call.name),
    )


def closing_status(done: Done, kind: str) -> str:
    """The status of the last item of a finished response: ``incomplete`` for text a limit cut.

    A call the parser read whole stays ``completed``.
    """
    return "incomplete" if done.cause.truncated and kind in ("message", "reasoning") else "completed"


def output_items(completion: Completion, tools: OfferedTools) -> list[wire.OutputItem]:
    """The output of a whole completion, item by item in generation order (as streamed)."""
    items: list[wire.OutputItem] = []
    parts = completion.parts
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        match part:
            case ReasoningDelta(text=text):
                status = closing_status(completion.done, "reasoning") if last else "completed"
                items.append(reasoning_item(new_id("rs_"), text, status))
            case TextDelta(text=text):
                status = closing_status(completion.done, "message") if last else "completed"
                items.append(message_item(new_id("msg_"), text, status))
            case ToolCall():
                items.append(function_call_item(new_id("fc_"), part, tools))
    return answered(items, completion.done)


def answered(items: list[wire.OutputItem], done: Done) -> list[wire.OutputItem]:
    """*items*, with an empty message when they hold neither a message nor a call (streamed or not)."""
    if any(
        isinstance(item, wire.MessageOut | wire.FunctionCallOut | wire.CustomToolCallOut) for item in items
    ):
        return items
    return [*items, message_item(new_id("msg_"), "", closing_status(done, "message"))]


def usage(done: Done) -> wire.Usage:
    """Responses usage: input tokens include those read from the cache."""
    stats = done.stats
    return wire.Usage(
        input_tokens=stats.prompt_tokens,
        input_tokens_details=wire.InputTokensDetails(
            cached_tokens=stats.cached_tokens, shared_tokens=stats.cache.shared_tokens
        ),
        output_tokens=stats.completion_tokens,
        output_tokens_details=wire.OutputTokensDetails(reasoning_tokens=done.reasoning_tokens),
        total_tokens=stats.prompt_tokens + stats.completion_tokens,
    )


def response(
    body: wire.ResponsesRequest,
    *,
    response_id: str,
    created_at: int,
    model: str,
    output: list[wire.OutputItem],
    done: Done | None,
) -> wire.Response:
    """A response object; ``done`` ``None`` means still in progress."""
    status, incomplete = "in_progress", None
    if done is not None:
        truncated = done.cause.truncated
        status = "incomplete" if truncated else "completed"
        incomplete = wire.IncompleteDetails(reason="max_output_tokens") if truncated else None
    return wire.Response(
        id=response_id,
        created_at=created_at,
        status=status,
        error=None,
        incomplete_details=incomplete,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=model,
        output=output,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        reasoning=body.reasoning or wire.ReasoningConfig(),
        store=body.store is not False,
        temperature=body.temperature,
        text=body.text or wire.TextConfig(format={"type": "text"}),
        tool_choice=body.tool_choice or "auto",
        tools=body.tools or [],
        top_p=body.top_p,
        truncation=body.truncation or "disabled",
        usage=usage(done) if done is not None else None,
        metadata=body.metadata or {},
    )


def assistant_message(items: list[wire.OutputItem]) -> Message:
    """The turn a response's output adds to the conversation (for continuations)."""
    text = "".join(part.text for item in items if isinstance(item, wire.MessageOut) for part in item.content)
    reasoning = "".join(
        part.text for item in items if isinstance(item, wire.ReasoningOut) for part in item.content
    )
    calls = tuple(
        ToolCall(
            id=item.call_id,
            name=item.name,
            arguments=item.arguments
            if isinstance(item, wire.FunctionCallOut)
            else dumps({CUSTOM_INPUT: item.input}),
        )
        for item in items
        if isinstance(item, wire.FunctionCallOut | wire.CustomToolCallOut)
    )
    return Message(role="assistant", content=text or None, reasoning=reasoning or None, tool_calls=calls)
