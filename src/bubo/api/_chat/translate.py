"""The chat-completions body (:mod:`.wire`) to the domain's ``ChatRequest``.

Also the field checks OpenAI's completions body shares with it (``n``, ``max_tokens``, ``stop``, …).
"""

from __future__ import annotations

from typing import Protocol

import attrs

from bubo.api._constraints import output_constraint
from bubo.api._images import ImageCollector
from bubo.api._llama_fields import lora_scales
from bubo.api._nesting import check_arguments_depth
from bubo.api._numbers import check_bias, check_token_limit, draft_overrides, sampling_overrides, token_id
from bubo.api._omitted import Omissions
from bubo.api._stops import stop_strings
from bubo.domain.messages import ChatPrompt, Message, Role, ToolCall, ToolSpec
from bubo.domain.requests import ChatRequest, GenerationOptions, OutputFormat, ReasoningControl, ToolChoice
from bubo.domain.sampling import LogitBias, SamplingOverrides
from bubo.errors import InvalidRequest, UnsupportedContent

from . import wire

__all__ = [
    "SamplingFields",
    "chat_request",
    "check_n",
    "max_tokens",
    "reasoning_control",
    "sampling",
    "stop",
    "top_logprobs",
]

_MAX_TOP_LOGPROBS = 20


class SamplingFields(Protocol):
    """A body with the sampler fields :func:`sampling_overrides` reads and OpenAI's ``logit_bias``."""

    @property
    def logit_bias(self) -> dict[str, float] | None: ...


def chat_request(body: wire.ChatCompletionRequest, *, takes_images: bool = False) -> ChatRequest:
    """The domain request for a chat completion (*takes_images*: the model reads ``image_url`` parts).

    Raises:
        InvalidRequest: ``missing_messages``, ``unsupported_n``, or a field out of range.

    """
    if not body.messages:
        raise InvalidRequest(
            "messages is required and must be a non-empty array", code="missing_messages", param="messages"
        )
    check_n(body.n)
    n_probs = None
    if body.logprobs:
        n_probs = top_logprobs(body.top_logprobs, "top_logprobs")
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
    omissions = Omissions()
    images = ImageCollector(omissions, takes_images=takes_images)
    newest_user = max((i for i, m in enumerate(body.messages) if m.role == "user"), default=-1)
    messages = tuple(
        _message(m, i, omissions, images, refuse=i == newest_user) for i, m in enumerate(body.messages)
    )
    return ChatRequest(
        prompt=ChatPrompt(
            messages=messages,
            tools=tuple(_tool(t, i) for i, t in enumerate(body.tools or ())),
            template_kwargs=body.chat_template_kwargs or {},
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            images=images.images,
            media_marker=images.marker,
        ),
        options=GenerationOptions(
            max_tokens=max_tokens(limit, limit_param),
            sampling=sampling(body),
            stop=stop(body.stop),
            n_probs=n_probs,
            ignore_eos=bool(body.ignore_eos),
            speculative=draft_overrides(body),
            lora=lora_scales(body.lora),
        ),
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        reasoning=reasoning_control(body),
        output_format=output_format,
        grammar=grammar,
        omitted=omissions.counts(),
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


def check_n(n: int | None) -> None:
    """Refuse ``n`` other than 1 (``unsupported_n``)."""
    if n is not None and n != 1:
        raise InvalidRequest(f"only n = 1 is supported, got {n}", code="unsupported_n", param="n")


def top_logprobs(value: int | None, param: str) -> int:
    """The number of alternatives per token, 0 to 20 (``None``: 0)."""
    value = 0 if value is None else value
    if not 0 <= value <= _MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{param} must be between 0 and {_MAX_TOP_LOGPROBS}, got {value}", param=param)
    return value


def stop(stop: str | list[str] | None) -> tuple[str, ...]:
    """``stop`` as a tuple of strings, within the bounds every dialect shares (``api/_stops.py``).

    Raises:
        InvalidRequest: too many stop strings or characters; ``param`` ``stop``.

    """
    return stop_strings(stop, "stop")


def sampling(body: SamplingFields) -> SamplingOverrides:
    """The sampling fields and ``logit_bias`` of a chat or completion body."""
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


def _message(
    message: wire.ChatMessage, index: int, omissions: Omissions, images: ImageCollector, *, refuse: bool
) -> Message:
    param = f"messages[{index}]"
    if message.content is None and message.role != "assistant":
        raise InvalidRequest(f"a {message.role} message needs content", param=f"{param}.content")
    return Message(
        role=_role(message.role),
        content=_content(message.content, f"{param}.content", omissions, images, refuse=refuse),
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
        text_parts=_assistant_parts(message),
    )


def _assistant_parts(message: wire.ChatMessage) -> tuple[str, ...]:
    """An assistant message's text parts, when its content is text parts only (what a prefill continues)."""
    content = message.content
    if message.role != "assistant" or not isinstance(content, list):
        return ()
    if not all(isinstance(part, wire.TextPart) for part in content):
        return ()
    return tuple(part.text for part in content if isinstance(part, wire.TextPart))


_OMITTED_KINDS = {"image_url": "image", "input_audio": "audio", "file": "file"}


def _content(
    content: str | list[wire.ContentPart] | None,
    param: str,
    omissions: Omissions,
    images: ImageCollector,
    *,
    refuse: bool,
) -> str | None:
    """A message's text, its images at their markers (a model that takes them).

    An image for a text model, an audio or a file part is a placeholder, or (with *refuse*) a 400.
    """
    if content is None or isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        if isinstance(part, wire.TextPart):
            texts.append(part.text)
        elif isinstance(part, wire.ImagePart):
            url = part.image_url.url
            texts.append(images.data_uri(url, f"{param}[{index}]", field=".image_url.url", refuse=refuse))
        elif refuse:
            raise UnsupportedContent(part.type, param=f"{param}[{index}]")
        else:
            texts.append(omissions.placeholder(_OMITTED_KINDS[part.type]))
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
