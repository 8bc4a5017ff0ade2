"""OpenAI wire ↔ domain: requests down, output events and completions up."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from bubo.api._constraints import output_constraint
from bubo.api._nesting import check_arguments_depth
from bubo.api._numbers import check_bias, check_token_limit, sampling_overrides, token_id
from bubo.api._usage import timings, usage
from bubo.domain.generation import TokenLogprob
from bubo.domain.messages import ChatPrompt, Message, Role, ToolCall, ToolSpec
from bubo.domain.output import Completion
from bubo.domain.requests import (
    ChatRequest,
    CompletionRequest,
    GenerationOptions,
    OutputFormat,
    PromptPiece,
    ReasoningControl,
    ToolChoice,
)
from bubo.domain.sampling import LogitBias, SamplingOverrides
from bubo.errors import InvalidRequest, UnsupportedContent

from . import wire

__all__ = [
    "chat_completion",
    "chat_logprobs",
    "chat_request",
    "completion_logprobs",
    "completion_request",
    "max_tokens",
    "text_completion",
]

_MAX_TOP_LOGPROBS = 20


def chat_request(body: wire.ChatCompletionRequest) -> ChatRequest:
    """The domain request for a chat completion.

    Raises:
        InvalidRequest: ``missing_messages``, ``unsupported_n``, or a field out of range.

    """
    if not body.messages:
        raise InvalidRequest(
            "messages is required and must be a non-empty array", code="missing_messages", param="messages"
        )
    _check_n(body.n)
    n_probs = None
    if body.logprobs:
        n_probs = _top_logprobs(body.top_logprobs, "top_logprobs")
    elif body.top_logprobs is not None:
        raise InvalidRequest("top_logprobs requires logprobs: true", param="top_logprobs")
    output_format, grammar = output_constraint(
        grammar=body.grammar,
        json_schema=body.json_schema,
        response_format=_output_format(body.response_format),
    )
    limit, limit_param = (
        (body.max_completion_tokens, "max_completion_tokens")
        if body.max_completion_tokens is not None
        else (body.max_tokens, "max_tokens")
    )
    return ChatRequest(
        prompt=ChatPrompt(
            messages=tuple(_message(m, i) for i, m in enumerate(body.messages)),
            tools=tuple(_tool(t, i) for i, t in enumerate(body.tools or ())),
            template_kwargs=body.chat_template_kwargs or {},
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
        ),
        options=GenerationOptions(
            max_tokens=max_tokens(limit, limit_param),
            sampling=_sampling(body),
            stop=_stop(body.stop),
            n_probs=n_probs,
        ),
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        reasoning=reasoning_control(body),
        output_format=output_format,
        grammar=grammar,
    )


def _tool_choice(choice: str | wire.NamedToolChoice | None) -> ToolChoice:
    if choice is None:
        return ToolChoice()
    if isinstance(choice, wire.NamedToolChoice):
        return ToolChoice(mode="named", name=choice.function.name, param="tool_choice.function.name")
    return ToolChoice(mode=choice)  # type: ignore[arg-type]


def _output_format(response_format: wire.ResponseFormat | None) -> OutputFormat | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.schema is not None:  # llama-server's form, for either type
        return OutputFormat(schema=response_format.schema, param="response_format.schema")
    if response_format.type == "json_object":
        return OutputFormat(schema={"type": "object"}, param="response_format")
    spec = response_format.json_schema
    if spec is None or spec.schema is None:
        raise InvalidRequest(
            "response_format json_schema needs json_schema.schema", param="response_format.json_schema.schema"
        )
    return OutputFormat(schema=spec.schema, param="response_format.json_schema.schema")


def reasoning_control(body: wire.ChatCompletionRequest) -> ReasoningControl:
    """Thinking as ``reasoning_effort``, ``thinking`` and ``chat_template_kwargs`` say, which must agree.

    Raises:
        InvalidRequest: two of them disagree; the message names both fields.

    """
    control = ReasoningControl.from_effort(body.reasoning_effort)
    said = "reasoning_effort"
    if body.thinking is not None:
        wanted = body.thinking.type == "enabled"
        if control.enabled is not None and control.enabled != wanted:
            raise InvalidRequest(
                f"reasoning_effort ({body.reasoning_effort}) and thinking ({body.thinking.type}) disagree",
                code="conflicting_reasoning",
                param="thinking",
            )
        control = attrs.evolve(control, enabled=wanted, budget_tokens=body.thinking.budget_tokens)
        said = "thinking"
    kwargs = body.chat_template_kwargs or {}
    if "enable_thinking" in kwargs:
        value = kwargs["enable_thinking"]
        if not isinstance(value, bool):
            raise InvalidRequest(
                "chat_template_kwargs.enable_thinking must be a boolean",
                param="chat_template_kwargs.enable_thinking",
            )
        if control.enabled is not None and value != control.enabled:
            raise InvalidRequest(
                f"chat_template_kwargs.enable_thinking ({str(value).lower()}) disagrees with {said}",
                code="conflicting_reasoning",
                param="chat_template_kwargs.enable_thinking",
            )
    if (
        "reasoning_effort" in kwargs
        and control.effort is not None
        and kwargs["reasoning_effort"] != control.effort
    ):
        raise InvalidRequest(
            f"chat_template_kwargs.reasoning_effort ({kwargs['reasoning_effort']}) disagrees with "
            f"reasoning_effort ({control.effort})",
            code="conflicting_reasoning",
            param="chat_template_kwargs.reasoning_effort",
        )
    return control


def completion_request(body: wire.CompletionRequest) -> CompletionRequest:
    """The domain request for a legacy text completion.

    Raises:
        InvalidRequest: no prompt, several prompts, ``n`` other than 1, ``echo``/``suffix``.

    """
    _check_n(body.n)
    if body.echo:
        raise InvalidRequest("echo is not supported", code="unsupported_echo", param="echo")
    if body.suffix:
        raise InvalidRequest("suffix is not supported", code="unsupported_suffix", param="suffix")
    n_probs = None
    if body.logprobs is not None:
        n_probs = _top_logprobs(body.logprobs, "logprobs")
    output_format, grammar = output_constraint(grammar=body.grammar, json_schema=body.json_schema)
    return CompletionRequest(
        prompt=_prompt(body.prompt),
        options=GenerationOptions(
            max_tokens=max_tokens(body.max_tokens, "max_tokens"),
            sampling=_sampling(body),
            stop=_stop(body.stop),
            n_probs=n_probs,
        ),
        output_format=output_format,
        grammar=grammar,
    )


def max_tokens(value: int | None, param: str) -> int | None:
    """A token limit: ``None`` or ``-1`` keep the server default, else a positive integer.

    Raises:
        InvalidRequest: zero or another negative number, or more than 2,147,483,647 (32 bits).

    """
    if value is None or value == -1:
        return None
    if value < 1:
        raise InvalidRequest(f"{param} must be a positive integer or -1, got {value}", param=param)
    return check_token_limit(value, param)


def _check_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise InvalidRequest(f"only n = 1 is supported, got {n}", code="unsupported_n", param="n")


def _top_logprobs(value: int | None, param: str) -> int:
    value = 0 if value is None else value
    if not 0 <= value <= _MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{param} must be between 0 and {_MAX_TOP_LOGPROBS}, got {value}", param=param)
    return value


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _sampling(body: wire.ChatCompletionRequest | wire.CompletionRequest) -> SamplingOverrides:
    return sampling_overrides(body, _logit_bias(body.logit_bias))


def _logit_bias(bias: dict[str, float] | None) -> LogitBias:
    if not bias:
        return ()
    out: list[tuple[int | str, float]] = []
    for key, value in bias.items():
        param = f"logit_bias.{key}"
        token = token_id(key, param)
        if token is None:
            raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}", param=param)
        out.append((token, check_bias(value, param)))
    return tuple(out)


def _role(role: str) -> Role:
    return "system" if role == "developer" else role  # type: ignore[return-value]


def _message(message: wire.ChatMessage, index: int) -> Message:
    param = f"messages[{index}]"
    if message.content is None and message.role != "assistant":
        raise InvalidRequest(f"a {message.role} message needs content", param=f"{param}.content")
    return Message(
        role=_role(message.role),
        content=_content(message.content, f"{param}.content"),
        reasoning=message.reasoning_content if message.reasoning_content is not None else message.reasoning,
        tool_calls=tuple(
            ToolCall(
                id=call.id,
                name=call.function.name,
                arguments=check_arguments_depth(
                    call.function.arguments, f"{param}.tool_calls[{call_index}].function.arguments"
                ),
            )
            for call_index, call in enumerate(message.tool_calls or ())
        ),
        tool_call_id=message.tool_call_id,
        name=message.name,
    )


def _content(content: str | list[wire.ContentPart] | None, param: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, wire.TextPart):
            raise UnsupportedContent(part.type, param=f"{param}[{index}]")
        texts.append(part.text)
    return "\n".join(texts)


def _tool(tool: wire.Tool, index: int) -> ToolSpec:
    function = tool.function
    return ToolSpec(
        name=function.name,
        description=function.description,
        parameters=function.parameters or {"type": "object", "properties": {}},
        strict=function.strict,
        param=f"tools[{index}].function.parameters",
    )


def _prompt(prompt: str | list[int | str] | list[list[int]] | None) -> tuple[PromptPiece, ...]:
    if not prompt:
        raise InvalidRequest("prompt is required", code="missing_prompt", param="prompt")
    if isinstance(prompt, str):
        return (prompt,)
    if all(isinstance(p, list) for p in prompt):
        if len(prompt) != 1:
            raise InvalidRequest(
                "only one prompt per request is supported", code="unsupported_n", param="prompt"
            )
        return tuple(prompt[0])  # type: ignore[arg-type]
    if all(isinstance(p, str) for p in prompt) and len(prompt) > 1:
        raise InvalidRequest("only one prompt per request is supported", code="unsupported_n", param="prompt")
    return tuple(p for p in prompt if not isinstance(p, list))


# ---- responses -----------------------------------------------------------------------------


def _token_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(entries: Sequence[TokenLogprob]) -> wire.ChoiceLogprobs:
    """Chat ``logprobs.content`` for the given tokens."""
    return wire.ChoiceLogprobs(
        content=[
            wire.TokenLogprob(
                id=entry.token_id,
                token=_token_text(entry.piece),
                logprob=entry.logprob,
                bytes=list(entry.piece),
                top_logprobs=[
                    wire.TopLogprob(
                        id=top.token_id,
                        token=_token_text(top.piece),
                        logprob=top.logprob,
                        bytes=list(top.piece),
                    )
                    for top in entry.top
                ],
            )
            for entry in entries
        ]
    )


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> wire.CompletionLogprobs:
    """Legacy completions ``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens = [_token_text(e.piece) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return wire.CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=[{_token_text(t.piece): t.logprob for t in e.top} for e in entries],
        text_offset=offsets,
    )


def chat_completion(
    completion: Completion, *, response_id: str, created: int, model: str, fingerprint: str, logprobs: bool
) -> wire.ChatCompletion:
    """A whole chat completion."""
    done = completion.done
    tool_calls = [
        wire.ToolCallOut(id=c.id, function=wire.FunctionCall(name=c.name, arguments=c.arguments))
        for c in completion.tool_calls
    ]
    return wire.ChatCompletion(
        id=response_id,
        created=created,
        model=model,
        system_fingerprint=fingerprint,
        choices=[
            wire.Choice(
                index=0,
                message=wire.AssistantMessage(
                    content=completion.text if completion.text or not tool_calls else None,
                    reasoning_content=completion.reasoning or None,
                    reasoning=completion.reasoning or None,
                    tool_calls=tool_calls or None,
                ),
                logprobs=chat_logprobs(completion.logprobs) if logprobs else None,
                finish_reason=done.finish_reason,
            )
        ],
        usage=usage(done.stats, reasoning_tokens=done.reasoning_tokens),
        timings=timings(done.stats),
    )


def text_completion(
    completion: Completion, *, response_id: str, created: int, model: str, fingerprint: str, logprobs: bool
) -> wire.TextCompletion:
    """A whole text completion."""
    done = completion.done
    return wire.TextCompletion(
        id=response_id,
        created=created,
        model=model,
        system_fingerprint=fingerprint,
        choices=[
            wire.CompletionChoice(
                index=0,
                text=completion.text,
                logprobs=completion_logprobs(completion.logprobs) if logprobs else None,
                finish_reason=done.finish_reason,
            )
        ],
        usage=usage(done.stats),
        timings=timings(done.stats),
    )
