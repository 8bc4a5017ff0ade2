"""OpenAI streaming: ``chat.completion.chunk`` and ``text_completion`` chunks.

Chat, as the reference describes it: the first chunk carries ``delta.role``;
answer and reasoning text arrive in ``delta.content`` / ``delta.reasoning_content``;
the last chunk with choices has an empty delta, the ``finish_reason`` and
``timings``; with ``stream_options.include_usage`` one more chunk follows with
``choices: []`` and ``usage``; then ``data: [DONE]``.

Keep-alives are chunks every client parses, not SSE comments: agents such as
qwen-code count parsed chunks against an idle timeout (240 s), and a comment
never reaches it.  A chat keep-alive is a chunk of the stream with an empty
delta and a null ``finish_reason`` (the first one, while the request waits for
its slot, is the role chunk itself, so the role is still sent exactly once and
first); a completions keep-alive is a choice with empty text.  None follows
the finish chunk (``EventStreamBody`` sends no keep-alive after the last
event), so nothing comes after it but the usage chunk and ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from bubo.api._errors import error_envelope
from bubo.api._json import dumps, unstructure
from bubo.api._progress import LiveTimings, progress
from bubo.api._sse import sse_frame
from bubo.api._usage import Timings, timings, usage
from bubo.api._verbose import verbose_fields
from bubo.domain.generation import PromptProgress
from bubo.domain.output import (
    Done,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.errors import BuboError

from . import wire
from .translate import chat_logprobs, completion_logprobs

__all__ = ["ChatStream", "CompletionStream", "StreamIdentity"]

_DONE = b"data: [DONE]\n\n"


@attrs.frozen(kw_only=True)
class StreamIdentity:
    """What every chunk of one response repeats."""

    id: str
    created: int
    model: str
    fingerprint: str


def _frame(model: object, extra: dict[str, Any] | None = None) -> bytes:
    """An SSE data frame of *model*, with *extra* keys (``__verbose``) beside its fields."""
    data = unstructure(model)
    return sse_frame(dumps({**data, **extra} if extra else data))


def _error_frames(error: BuboError) -> list[bytes]:
    return [sse_frame(dumps(unstructure(error_envelope(error))))]


class ChatStream:
    """Encodes output events as ``chat.completion.chunk`` frames.

    llama-server's ``return_progress`` adds a chunk without choices and with
    ``prompt_progress`` per prompt chunk evaluated; ``timings_per_token`` puts
    the ``timings`` so far on every chunk.
    """

    def __init__(
        self,
        identity: StreamIdentity,
        *,
        include_usage: bool,
        logprobs: bool,
        return_progress: bool = False,
        timings_per_token: bool = False,
        verbose_prompt: str | None = None,
    ) -> None:
        self._identity = identity
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._return_progress = return_progress
        self._live = LiveTimings() if timings_per_token else None
        self._verbose_prompt = verbose_prompt  # --verbose: the finish chunk carries __verbose
        self._opened = False  # the role chunk went out (from opening() or as the first keep-alive)

    def _envelope(
        self, choices: list[wire.ChunkChoice], extra: dict[str, Any] | None = None, **fields: Any
    ) -> bytes:
        """A ``chat.completion.chunk`` frame of this stream: its identity, *choices* and *fields*."""
        identity = self._identity
        return _frame(
            wire.ChatCompletionChunk(
                id=identity.id,
                created=identity.created,
                model=identity.model,
                system_fingerprint=identity.fingerprint,
                choices=choices,
                **fields,
            ),
            extra,
        )

    def _chunk(
        self,
        delta: wire.Delta | wire.RoleDelta,
        *,
        finish_reason: str | None = None,
        logprobs: wire.ChoiceLogprobs | None = None,
        timings: Timings | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        if timings is None and self._live is not None:
            timings = self._live.now()
        choice = wire.ChunkChoice(index=0, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
        return self._envelope([choice], extra, timings=timings)

    def _progress(self, event: PromptProgress) -> bytes:
        timings = self._live.now() if self._live is not None else None
        return self._envelope([], timings=timings, prompt_progress=progress(event))

    def _role(self) -> bytes:
        """The role chunk, without ``timings`` even with ``timings_per_token``: nothing is timed yet."""
        self._opened = True
        choice = wire.ChunkChoice(index=0, delta=wire.RoleDelta(), finish_reason=None)
        return self._envelope([choice])

    def opening(self) -> Iterable[bytes]:
        """The role chunk, unless a keep-alive sent it while the request waited for its slot."""
        return () if self._opened else [self._role()]

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        """Frames for one output event."""
        if self._live is not None:
            self._live.saw(event)
        match event:
            case PromptProgress() if self._return_progress:
                yield self._progress(event)
            case TextDelta(text=text, logprobs=entries):
                logprobs = chat_logprobs(entries) if self._logprobs and entries else None
                if text or logprobs is not None:
                    yield self._chunk(wire.Delta(content=text), logprobs=logprobs)
            case ReasoningDelta(text=text):
                yield self._chunk(wire.Delta(reasoning_content=text, reasoning=text))
            case ToolCallStart(index=index, id=call_id, name=name):
                call = wire.ToolCallDelta(
                    index=index, id=call_id, type="function", function={"name": name, "arguments": ""}
                )
                yield self._chunk(wire.Delta(tool_calls=[call]))
            case ToolCallArgumentsDelta(index=index, fragment=fragment):
                call = wire.ToolCallDelta(index=index, function={"arguments": fragment})
                yield self._chunk(wire.Delta(tool_calls=[call]))
            case Done():
                yield from self._closing(event)

    def _closing(self, done: Done) -> list[bytes]:
        final = timings(done.stats)
        extra = None if self._verbose_prompt is None else verbose_fields(self._verbose_prompt, done)
        frames = [self._chunk(wire.Delta(), finish_reason=done.finish_reason, timings=final, extra=extra)]
        if self._include_usage:
            # The timings again on the usage chunk: llama-server puts them on a stream's last chunk.
            stats = usage(done.stats, reasoning_tokens=done.reasoning_tokens)
            frames.append(self._envelope([], usage=stats, timings=final))
        frames.append(_DONE)
        return frames

    def error(self, error: BuboError) -> Iterable[bytes]:
        """An ``{"error": …}`` data frame; the stream ends there."""
        return _error_frames(error)

    def keepalive(self) -> Iterable[bytes]:
        """A chunk whose delta adds nothing: the role chunk if none went out yet.

        The OpenAI SDKs (Python and JS) yield it and their stream helpers add nothing from it; the
        AI SDK's openai-compatible provider (opencode) and qwen-code skip an empty delta; litellm
        drops it.  The role is never repeated: the Python SDK's helper concatenates string fields of
        deltas, so a second role chunk would make the message's role ``"assistantassistant"``.
        """
        if not self._opened:
            return [self._role()]
        return [self._chunk(wire.Delta())]


class CompletionStream:
    """Encodes output events as ``text_completion`` frames.

    The finish chunk carries the ``finish_reason`` and ``timings``.  With
    ``stream_options.include_usage`` the usage follows in one more chunk with
    ``choices: []`` (OpenAI's rule, as for chat); without it the finish chunk
    carries the usage too (llama-server's completions do).
    """

    def __init__(
        self,
        identity: StreamIdentity,
        *,
        include_usage: bool,
        logprobs: bool,
        verbose_prompt: str | None = None,
    ) -> None:
        self._identity = identity
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._offset = 0
        self._verbose_prompt = verbose_prompt  # --verbose: the finish chunk carries __verbose

    def _chunk(
        self,
        text: str | None,
        *,
        finish_reason: str | None = None,
        logprobs: wire.CompletionLogprobs | None = None,
        usage_of: Done | None = None,
        timings_of: Done | None = None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        identity = self._identity
        choices = (  # no text: the usage chunk, without choices
            []
            if text is None
            else [wire.CompletionChoice(index=0, text=text, logprobs=logprobs, finish_reason=finish_reason)]
        )
        return _frame(
            wire.TextCompletion(
                id=identity.id,
                created=identity.created,
                model=identity.model,
                system_fingerprint=identity.fingerprint,
                choices=choices,
                usage=usage(usage_of.stats) if usage_of else None,
                timings=timings(timings_of.stats) if timings_of else None,
            ),
            extra,
        )

    def opening(self) -> Iterable[bytes]:
        """Nothing: the first text chunk opens the stream."""
        return ()

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        """Frames for one output event."""
        match event:
            case TextDelta(text=text, logprobs=entries):
                logprobs = completion_logprobs(entries, self._offset) if self._logprobs and entries else None
                self._offset += len(text)
                if not text and logprobs is None:
                    return ()
                return [self._chunk(text, logprobs=logprobs)]
            case Done():
                return self._closing(event)
        return ()

    def _closing(self, done: Done) -> list[bytes]:
        extra = None if self._verbose_prompt is None else verbose_fields(self._verbose_prompt, done)
        if not self._include_usage:
            finish = self._chunk(
                "", finish_reason=done.finish_reason, usage_of=done, timings_of=done, extra=extra
            )
            return [finish, _DONE]
        return [
            self._chunk("", finish_reason=done.finish_reason, timings_of=done, extra=extra),
            self._chunk(None, usage_of=done),
            _DONE,
        ]

    def error(self, error: BuboError) -> Iterable[bytes]:
        """An ``{"error": …}`` data frame; the stream ends there."""
        return _error_frames(error)

    def keepalive(self) -> Iterable[bytes]:
        """A choice with empty text and a null ``finish_reason``."""
        return [self._chunk("")]
