"""OpenAI wire ↔ domain: the completions request down, output events and completions up.

The chat-completions request is shared with other routes: :mod:`bubo.api._chat.translate`.
"""

from __future__ import annotations

from collections.abc import Sequence

from bubo.api._chat.translate import check_n, max_tokens, sampling, stop, top_logprobs
from bubo.api._chat.wire import FunctionCall
from bubo.api._constraints import output_constraint
from bubo.api._llama_fields import lora_scales
from bubo.api._usage import timings, usage
from bubo.domain.generation import TokenLogprob
from bubo.domain.output import Completion
from bubo.domain.requests import CompletionRequest, GenerationOptions, PromptPiece
from bubo.errors import InvalidRequest

from . import wire

__all__ = [
    "chat_completion",
    "chat_logprobs",
    "completion_logprobs",
    "completion_request",
    "text_completion",
]


def completion_request(body: wire.CompletionRequest) -> CompletionRequest:
    """The domain request for a legacy text completion.

    Raises:
        InvalidRequest: no prompt, several prompts, ``n`` other than 1, ``echo``/``suffix``.

    """
    check_n(body.n)
    if body.echo:
        raise InvalidRequest("echo is not supported", code="unsupported_echo", param="echo")
    if body.suffix:
        raise InvalidRequest("suffix is not supported", code="unsupported_suffix", param="suffix")
    n_probs = None
    if body.logprobs is not None:
        n_probs = top_logprobs(body.logprobs, "logprobs")
    output_format, grammar = output_constraint(grammar=body.grammar, json_schema=body.json_schema)
    return CompletionRequest(
        prompt=_prompt(body.prompt),
        options=GenerationOptions(
            max_tokens=max_tokens(body.max_tokens, "max_tokens"),
            sampling=sampling(body),
            stop=stop(body.stop),
            n_probs=n_probs,
            ignore_eos=bool(body.ignore_eos),
            lora=lora_scales(body.lora),
        ),
        output_format=output_format,
        grammar=grammar,
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
        wire.ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
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
