"""Anthropic wire ↔ domain: requests down, completions up."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import attrs

from bubo.api._images import ImageCollector, refuse_url
from bubo.api._llama_fields import lora_scales
from bubo.api._nesting import check_value_depth
from bubo.api._numbers import check_token_limit, checked_sampling
from bubo.api._omitted import Omissions
from bubo.api._stops import stop_strings
from bubo.domain.generation import GenerationStats, StopCause
from bubo.domain.messages import ChatPrompt, Message, ToolCall, ToolSpec
from bubo.domain.output import Completion, Done, ReasoningDelta, TextDelta
from bubo.domain.requests import ChatRequest, GenerationOptions, OutputFormat, ReasoningControl, ToolChoice
from bubo.errors import InvalidRequest, UnsupportedContent

from . import wire

__all__ = [
    "chat_prompt",
    "count_request",
    "message",
    "messages_request",
    "stop_reason",
    "tool_use_id",
    "usage",
]

logger = logging.getLogger(__name__)

_EMPTY_SCHEMA = {"type": "object", "properties": {}}
_STOP_REASONS = {
    StopCause.EOS: "end_turn",
    StopCause.STOP_WORD: "stop_sequence",
    StopCause.LIMIT: "max_tokens",
    StopCause.CONTEXT: "max_tokens",
    StopCause.TIME: "max_tokens",
}


def messages_request(body: wire.MessagesRequest, *, takes_images: bool = False) -> ChatRequest:
    """The domain request for ``POST /v1/messages`` (*takes_images*: the model reads ``image`` blocks).

    Raises:
        InvalidRequest: no messages, ``max_tokens`` below 1 or over 32 bits, a sampler setting
            out of range, unsupported content, an image that is not base64 data, disagreeing
            thinking controls.

    """
    if body.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {body.max_tokens}", param="max_tokens")
    check_token_limit(body.max_tokens, "max_tokens")
    return attrs.evolve(
        count_request(body, takes_images=takes_images),
        options=GenerationOptions(
            max_tokens=body.max_tokens,
            sampling=checked_sampling(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k),
            stop=stop_strings(body.stop_sequences, "stop_sequences"),
            lora=lora_scales(body.lora),
        ),
    )


def count_request(
    body: wire.MessagesRequest | wire.CountTokensRequest, *, takes_images: bool = False
) -> ChatRequest:
    """The conversation as generation renders it (``count_tokens`` counts exactly this).

    ``count_tokens`` reads no image (the contract: images are not supported there):
    without *takes_images* each is a placeholder, or a 400 in the newest user turn.
    """
    choice = body.tool_choice
    omissions = Omissions()
    messages = _cleared_thinking(body.messages, body.context_management)
    return ChatRequest(
        prompt=chat_prompt(
            body.system, messages, body.tools, omissions, ImageCollector(omissions, takes_images=takes_images)
        ),
        tool_choice=_tool_choice(choice),
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        reasoning=_reasoning(body.thinking, body.output_config),
        output_format=(
            OutputFormat(schema=body.output_config.format.schema, param="output_config.format.schema")
            if body.output_config is not None and body.output_config.format is not None
            else None
        ),
        omitted=omissions.counts(),
    )


def _tool_choice(choice: wire.ToolChoice | None) -> ToolChoice:
    if choice is None or choice.type == "auto":
        return ToolChoice()
    if choice.type == "none":
        return ToolChoice(mode="none")
    if choice.type == "any":
        return ToolChoice(mode="required")
    if choice.name is None:
        raise InvalidRequest('tool_choice of type "tool" needs a name', param="tool_choice.name")
    return ToolChoice(mode="named", name=choice.name, param="tool_choice.name")


_THINKING_TYPES = frozenset({"enabled", "adaptive", "between_tools", "disabled"})
_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})


def _reasoning(thinking: wire.ThinkingConfig | None, output: wire.OutputConfig | None) -> ReasoningControl:
    """Thinking as ``thinking`` and ``output_config.effort`` ask.

    ``thinking: disabled`` wins over an effort (Anthropic's effort also shapes
    the answer, which a local model has no control for); a type or effort Bubo
    does not know keeps the template's default, with a debug log.
    """
    effort = output.effort if output is not None else None
    if effort is not None and effort not in _EFFORTS:
        logger.debug("output_config.effort %r is not one Bubo knows; left to the template", effort)
        effort = None
    control = ReasoningControl.from_effort(effort)
    if thinking is None:
        return control
    if thinking.type not in _THINKING_TYPES:
        logger.debug("thinking type %r is not one Bubo knows; left to the template", thinking.type)
        return control
    if thinking.type == "disabled":
        return ReasoningControl(enabled=False)
    budget = thinking.budget_tokens if thinking.type == "enabled" else None
    if budget is not None and budget < 1:
        raise InvalidRequest("thinking.budget_tokens must be at least 1", param="thinking.budget_tokens")
    return attrs.evolve(control, enabled=True, budget_tokens=budget)


def _cleared_thinking(
    messages: list[wire.InputMessage] | None, management: wire.ContextManagement | None
) -> list[wire.InputMessage] | None:
    """*messages* after ``context_management``'s ``clear_thinking_20251015`` edit, as Anthropic applies it.

    ``keep: "all"`` keeps every thinking block; ``{"type": "thinking_turns",
    "value": N}`` (default 1) keeps those of the last N assistant turns.  Other
    edits (``clear_tool_uses_20250919``, which clears once a token threshold is
    passed) are not applied: the history is read whole, logged at debug level.
    """
    if not messages or management is None:
        return messages
    keep: int | None = None
    for index, edit in enumerate(management.edits or ()):
        if edit.type != _CLEAR_THINKING:
            logger.debug("context_management edit %r is not applied", edit.type)
            continue
        keep = _kept_thinking_turns(edit.keep, f"context_management.edits[{index}].keep")
    if keep is None:
        return messages
    assistant_turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
    cleared = set(assistant_turns[: max(0, len(assistant_turns) - keep)])
    return [
        attrs.evolve(m, content=[b for b in m.content if not isinstance(b, _THINKING_BLOCKS)])
        if i in cleared and not isinstance(m.content, str)
        else m
        for i, m in enumerate(messages)
    ]


_CLEAR_THINKING = "clear_thinking_20251015"
_THINKING_BLOCKS = (wire.ThinkingBlock, wire.RedactedThinkingBlock)


def _kept_thinking_turns(keep: str | dict[str, object] | None, param: str) -> int | None:
    """How many recent assistant turns keep their thinking (``None``: all of them)."""
    if keep == "all":
        return None
    if keep is None:
        return 1
    value = keep.get("value") if isinstance(keep, dict) and keep.get("type") == "thinking_turns" else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(
            'keep must be "all" or {"type": "thinking_turns", "value": N} with N of 0 or more', param=param
        )
    return value


def chat_prompt(
    system: str | list[wire.TextBlock] | None,
    messages: list[wire.InputMessage] | None,
    tools: list[wire.Tool] | None,
    omissions: Omissions | None = None,
    images: ImageCollector | None = None,
) -> ChatPrompt:
    """The conversation as the chat template sees it.

    ``system`` turns inside ``messages`` stay where they are (the template
    renders them there, or folds them into the next user turn; see
    :mod:`bubo.templates`).  Content a text model cannot read becomes a
    placeholder, except in the newest user turn, where it is refused.
    *images* (of a model that takes them) collects each ``image`` block, in
    the turns and in tool results, where its marker is written.

    An empty ``messages`` array is served as llama-server serves it: the
    template renders the system prompt alone (or nothing) and opens the
    assistant's turn.  Only an absent ``messages`` is refused.
    """
    if messages is None:
        raise InvalidRequest("messages is required", code="missing_messages", param="messages")
    omissions = omissions or Omissions()
    images = images or ImageCollector(omissions, takes_images=False)
    deferred = {t.name: t for t in tools or () if t.defer_loading}
    newest_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    reader = _Reader(omissions, images, deferred)
    turns: list[Message] = []
    if system:
        text = system if isinstance(system, str) else "\n".join(block.text for block in system)
        turns.append(Message(role="system", content=text))
    for index, turn in enumerate(messages):
        turns.extend(reader.turn(turn, f"messages[{index}]", newest=index == newest_user))
    return ChatPrompt(
        messages=tuple(turns), tools=_tools(tools or ()), images=images.images, media_marker=images.marker
    )


class _Reader:
    """Turns Anthropic blocks into domain messages for one request."""

    def __init__(self, omissions: Omissions, images: ImageCollector, deferred: dict[str, wire.Tool]) -> None:
        self._omissions = omissions
        self._images = images
        self._deferred = deferred

    def turn(self, turn: wire.InputMessage, param: str, *, newest: bool) -> list[Message]:
        """One turn as domain messages; a user turn's tool results come first, as ``tool`` messages."""
        if isinstance(turn.content, str):
            return [Message(role=turn.role, content=turn.content)]
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        results: list[Message] = []
        for index, block in enumerate(turn.content):
            where = f"{param}.content[{index}]"
            match block:
                case wire.ThinkingBlock(thinking=text) if turn.role == "assistant":
                    thinking.append(text)
                case wire.ThinkingBlock() | wire.RedactedThinkingBlock():
                    pass
                case wire.ToolUseBlock(id=call_id, name=name, input=arguments) if turn.role == "assistant":
                    check_value_depth(arguments, f"{where}.input")
                    calls.append(
                        ToolCall(id=call_id, name=name, arguments=json.dumps(arguments, ensure_ascii=False))
                    )
                case wire.ToolResultBlock() if turn.role == "user":
                    results.append(
                        Message(
                            role="tool", content=self._result(block, where), tool_call_id=block.tool_use_id
                        )
                    )
                case wire.ToolUseBlock() | wire.ToolResultBlock():
                    raise InvalidRequest(f"a {turn.role} turn cannot hold a {block.type} block", param=where)
                case wire.ImageBlock() | wire.DocumentBlock():
                    texts.append(self._media(block, where, newest=newest))
                case _:
                    texts.append(self.text(block, where))
        if turn.role == "assistant":
            return [
                Message(
                    role="assistant",
                    content="\n".join(texts) if texts else None,
                    reasoning="\n".join(thinking) if thinking else None,
                    tool_calls=tuple(calls),
                )
            ]
        return [*results, Message(role=turn.role, content="\n".join(texts))] if texts else results

    def _result(self, block: wire.ToolResultBlock, param: str) -> str:
        content = block.content
        if content is None or isinstance(content, str):
            return content or ""
        return "\n".join(self.text(part, f"{param}.content[{index}]") for index, part in enumerate(content))

    def _media(self, block: wire.ImageBlock | wire.DocumentBlock, param: str, *, newest: bool) -> str:
        """An image or a document in a turn; what the model cannot read in the newest user turn is a 400."""
        if isinstance(block, wire.ImageBlock):
            return self._image(block, param, refuse=newest)
        if newest and _document_text(block) is None:
            raise UnsupportedContent(block.type, param=param)
        return self.text(block, param)

    def _image(self, block: wire.ImageBlock, param: str, *, refuse: bool = False) -> str:
        """An ``image`` block: its marker (a ``base64`` source), a placeholder (a text model), or a 400.

        A ``url`` source is never fetched and a ``file`` source names a file
        this server does not keep: both are a 400 naming ``source``.
        """
        source = block.source or {}
        if not self._images.takes_images:
            return self._images.base64("", param, refuse=refuse)
        kind = source.get("type")
        if kind == "url":
            url = source.get("url")
            raise refuse_url(url if isinstance(url, str) else "", f"{param}.source")
        if kind != "base64":
            raise InvalidRequest(
                f'an image source must be {{"type": "base64", "media_type": …, "data": …}}, not {kind!r}: '
                "this server fetches nothing and keeps no files",
                code="image_url_not_supported" if kind == "file" else None,
                param=f"{param}.source",
            )
        data = source.get("data")
        if not isinstance(data, str):
            raise InvalidRequest(
                "a base64 image source needs its data (a string)", param=f"{param}.source.data"
            )
        return self._images.base64(data, param, field=".source.data")

    def text(self, block: wire.ResultBlock, param: str) -> str:
        """A block as the text the model reads (*param* names it)."""
        match block:
            case wire.ImageBlock():
                return self._image(block, param)
            case wire.DocumentBlock():
                return _document_text(block) or self._omissions.placeholder("document")
            case wire.ToolReferenceBlock(tool_name=name):
                return _tool_loaded(self._deferred.get(name), name)
        return _block_text(block)


def _block_text(block: wire.ResultBlock) -> str:
    """A block that needs nothing of the request as text."""
    match block:
        case wire.TextBlock(text=text):
            return text
        case wire.SearchResultBlock():
            body = "\n".join(part.text for part in block.content or ())
            source = f"({block.source})" if block.source else None
            heading = " ".join(x for x in (block.title, source) if x)
            return f"{heading}\n{body}" if heading else body
        case wire.OtherBlock():
            return _other_text(block)
    return ""


def _document_text(block: wire.DocumentBlock) -> str | None:
    """A text document's text (``source`` of type ``text`` or ``content``); ``None`` for PDFs and URLs."""
    source = block.source or {}
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif source.get("type") == "content" and isinstance(source.get("content"), str | list):
        content = source["content"]
        text = content if isinstance(content, str) else "\n".join(_texts_in(content))
    else:
        return None
    return f"{block.title}\n{text}" if block.title else text


def _texts_in(value: object) -> list[str]:
    """Every ``text`` string in a block or a list of blocks, in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in _texts_in(item)]
    if isinstance(value, dict):
        found = [value["text"]] if isinstance(value.get("text"), str) else []
        return found + _texts_in(value.get("content"))
    return []


def _other_text(block: wire.OtherBlock) -> str:
    """A block of a type Bubo does not know, as text: its text and content, else its name and input."""
    texts = _texts_in(block.text) + _texts_in(block.content)
    if texts:
        return "\n".join(texts)
    if block.name is not None:
        return f"[{block.type} {block.name}: {json.dumps(block.input, ensure_ascii=False)}]"
    logger.debug("a %s block holds no text; shown by its type", block.type)
    return f"[{block.type}]"


def _tool_loaded(tool: wire.Tool | None, name: str) -> str:
    """A tool reference as text: the deferred tool's definition, where the search found it.

    Anthropic's API loads a referenced tool into the prompt at the reference;
    so does Bubo, which keeps the tool list at the start of the prompt (and the
    prompt cache) unchanged.
    """
    if tool is None:
        return f"Tool {name} is available."
    definition = {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": tool.input_schema or _EMPTY_SCHEMA,
    }
    return f"Tool {name} is now available:\n{json.dumps(definition, ensure_ascii=False)}"


def _tools(tools: Sequence[wire.Tool]) -> tuple[ToolSpec, ...]:
    """The tools shown to the model: the client tools not deferred (a tool search loads those)."""
    out = []
    for index, tool in enumerate(tools):
        if tool.defer_loading:
            continue
        if tool.type not in (None, "custom"):
            logger.warning("skipping tool %r: server tool type %r is not supported", tool.name, tool.type)
            continue
        out.append(
            ToolSpec(
                name=tool.name,
                description=tool.description,
                parameters=tool.input_schema or _EMPTY_SCHEMA,
                param=f"tools[{index}].input_schema",
            )
        )
    return tuple(out)


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` spelling of a tool call id."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(done: Done) -> str:
    """``end_turn``, ``max_tokens``, ``stop_sequence`` or ``tool_use``."""
    return "tool_use" if done.finish_reason == "tool_calls" else _STOP_REASONS[done.cause]


def usage(stats: GenerationStats, output_tokens: int | None = None) -> wire.Usage:
    """Anthropic usage: ``input_tokens`` excludes the prompt tokens read from the cache."""
    return wire.Usage(
        input_tokens=stats.prompt_tokens - stats.cached_tokens,
        output_tokens=stats.completion_tokens if output_tokens is None else output_tokens,
        cache_read_input_tokens=stats.cached_tokens,
        cache_creation_input_tokens=0,
    )


def _arguments(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message(completion: Completion, *, message_id: str, model: str) -> wire.Message:
    """A whole Messages response: its blocks in generation order, as the stream opens them."""
    content: list[wire.TextOut | wire.ThinkingOut | wire.ToolUseOut] = []
    for part in completion.parts:
        match part:
            case ReasoningDelta(text=text):
                content.append(wire.ThinkingOut(thinking=text, signature=""))
            case TextDelta(text=text):
                content.append(wire.TextOut(text=text))
            case ToolCall(id=call_id, name=name, arguments=arguments):
                content.append(
                    wire.ToolUseOut(id=tool_use_id(call_id), name=name, input=_arguments(arguments))
                )
    done = completion.done
    return wire.Message(
        id=message_id,
        model=model,
        content=content,
        stop_reason=stop_reason(done),
        stop_sequence=done.stop_word if done.cause is StopCause.STOP_WORD else None,
        usage=usage(done.stats),
    )
