"""Anthropic wire ↔ domain: requests down, completions up."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import attrs

from bubo.api._nesting import check_value_depth
from bubo.api._numbers import check_sampling, check_token_limit
from bubo.domain.generation import GenerationStats, StopCause
from bubo.domain.messages import ChatPrompt, Message, ToolCall, ToolSpec
from bubo.domain.output import Completion, Done, ReasoningDelta, TextDelta
from bubo.domain.requests import ChatRequest, GenerationOptions, OutputFormat, ReasoningControl, ToolChoice
from bubo.domain.sampling import SamplingOverrides
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


def messages_request(body: wire.MessagesRequest) -> ChatRequest:
    """The domain request for ``POST /v1/messages``.

    Raises:
        InvalidRequest: no messages, ``max_tokens`` below 1 or over 32 bits, a sampler setting
            out of range, unsupported content, disagreeing thinking controls.

    """
    if body.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {body.max_tokens}", param="max_tokens")
    check_token_limit(body.max_tokens, "max_tokens")
    return attrs.evolve(
        count_request(body),
        options=GenerationOptions(
            max_tokens=body.max_tokens,
            sampling=check_sampling(
                SamplingOverrides(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
            ),
            stop=tuple(body.stop_sequences or ()),
        ),
    )


def count_request(body: wire.MessagesRequest | wire.CountTokensRequest) -> ChatRequest:
    """The conversation as generation renders it (``count_tokens`` counts exactly this)."""
    choice = body.tool_choice
    return ChatRequest(
        prompt=chat_prompt(body.system, body.messages, body.tools),
        tool_choice=_tool_choice(choice),
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        reasoning=_reasoning(body.thinking, body.output_config),
        output_format=(
            OutputFormat(schema=body.output_config.format.schema, param="output_config.format.schema")
            if body.output_config is not None and body.output_config.format is not None
            else None
        ),
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


def _reasoning(thinking: wire.ThinkingConfig | None, output: wire.OutputConfig | None) -> ReasoningControl:
    effort = output.effort if output is not None else None
    control = ReasoningControl.from_effort(effort)
    if thinking is None:
        return control
    enabled = thinking.type != "disabled"
    if effort is not None and not enabled:
        raise InvalidRequest(
            f"thinking is disabled but output_config.effort asks for {effort}",
            code="conflicting_reasoning",
            param="thinking",
        )
    budget = thinking.budget_tokens if thinking.type == "enabled" else None
    if budget is not None and budget < 1:
        raise InvalidRequest("thinking.budget_tokens must be at least 1", param="thinking.budget_tokens")
    return attrs.evolve(control, enabled=enabled, budget_tokens=budget)


def chat_prompt(
    system: str | list[wire.TextBlock] | None,
    messages: list[wire.InputMessage] | None,
    tools: list[wire.Tool] | None,
) -> ChatPrompt:
    """The conversation as the chat template sees it."""
    if not messages:
        raise InvalidRequest(
            "messages is required and must be a non-empty array", code="missing_messages", param="messages"
        )
    turns: list[Message] = []
    if system:
        text = system if isinstance(system, str) else "\n".join(block.text for block in system)
        turns.append(Message(role="system", content=text))
    for index, turn in enumerate(messages):
        turns.extend(_turn(turn, f"messages[{index}]"))
    return ChatPrompt(messages=tuple(turns), tools=_tools(tools or ()))


def _turn(turn: wire.InputMessage, param: str) -> list[Message]:
    """One Anthropic turn as domain messages; a user turn's tool results come first, as ``tool`` messages."""
    if isinstance(turn.content, str):
        return [Message(role=turn.role, content=turn.content)]
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for index, block in enumerate(turn.content):
        where = f"{param}.content[{index}]"
        match block:
            case wire.TextBlock(text=text):
                texts.append(text)
            case wire.ThinkingBlock(thinking=text) if turn.role == "assistant":
                thinking.append(text)
            case wire.RedactedThinkingBlock():
                pass
            case wire.ToolUseBlock(id=call_id, name=name, input=arguments) if turn.role == "assistant":
                check_value_depth(arguments, f"{where}.input")
                calls.append(
                    ToolCall(id=call_id, name=name, arguments=json.dumps(arguments, ensure_ascii=False))
                )
            case wire.ToolResultBlock() if turn.role == "user":
                results.append(
                    Message(role="tool", content=_result_text(block, where), tool_call_id=block.tool_use_id)
                )
            case wire.ImageBlock() | wire.DocumentBlock():
                raise UnsupportedContent(block.type, param=where)
            case _:
                raise InvalidRequest(f"a {turn.role} turn cannot hold a {block.type} block", param=where)
    if turn.role == "assistant":
        return [
            Message(
                role="assistant",
                content="\n".join(texts) if texts else None,
                reasoning="\n".join(thinking) if thinking else None,
                tool_calls=tuple(calls),
            )
        ]
    return [*results, Message(role="user", content="\n".join(texts))] if texts else results


def _result_text(block: wire.ToolResultBlock, param: str) -> str:
    content = block.content
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, wire.TextBlock):
            raise UnsupportedContent(part.type, param=f"{param}.content[{index}]")
        texts.append(part.text)
    return "\n".join(texts)


def _tools(tools: Sequence[wire.Tool]) -> tuple[ToolSpec, ...]:
    out = []
    for index, tool in enumerate(tools):
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
