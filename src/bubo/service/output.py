"""Engine events to output events: the per-request parser pipeline.

Generated text goes through the reasoning parser (``<think>`` split), and
the answer part through the tool-call parser; either may be absent.  The
pipeline also counts reasoning tokens and decides the finish reason.  A
structured answer the model ended itself is checked against its schema
(:mod:`.validation`) before the end is reported.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

import attrs
import trio

from bubo.domain.generation import (
    EngineEvent,
    GenerationFailed,
    GenerationFinished,
    PromptProgress,
    StopCause,
    TokenGenerated,
)
from bubo.domain.messages import ToolSpec
from bubo.domain.output import Done, OutputEvent, ReasoningDelta, TextDelta, finish_reason_for
from bubo.engine import EngineFailure
from bubo.parsers import ParserConfig, StreamParser, ThinkParser, make_tool_parser

from .validation import AnswerCheck

__all__ = ["OutputPlan", "output_events"]


@attrs.frozen(kw_only=True)
class OutputPlan:
    """Which parsers a request's output goes through (parsers are made per request)."""

    reasoning: bool = False  # split <think> reasoning out
    reasoning_in_content: bool = False  # and keep it in the answer too, tags and all (deepseek-legacy)
    starts_inside: bool = False  # the prompt already opened <think>
    tool_format: str | None = None  # parse tool calls of this format
    tool_config: ParserConfig = attrs.field(factory=ParserConfig)
    schema: Mapping[str, Any] | None = None  # the answer's JSON schema, checked once the model ends it
    schema_param: str = ""  # the request field holding it
    checked_tools: tuple[ToolSpec, ...] = ()  # a forced call: its arguments are checked against these


class _Pipeline:
    """The parsers of one request, and what they have seen."""

    def __init__(self, plan: OutputPlan) -> None:
        self._reasoning = ThinkParser(starts_inside=plan.starts_inside) if plan.reasoning else None
        self._reasoning_in_content = plan.reasoning_in_content
        self._tools: StreamParser | None = (
            make_tool_parser(plan.tool_format, plan.tool_config) if plan.tool_format else None
        )
        self.called_tools = False
        self.reasoning_tokens = 0
        self.raw: list[str] = []  # the generated text as the model wrote it (--verbose shows it)
        self._unassigned: list[int] = []  # tokens whose text the parsers still hold
        checked = plan.schema is not None or plan.checked_tools
        self.check = (
            AnswerCheck(schema=plan.schema, param=plan.schema_param, tools=plan.checked_tools)
            if checked
            else None
        )

    def feed(self, event: TokenGenerated) -> list[OutputEvent]:
        self.raw.append(event.text)
        return self._kept(self._feed(event))

    def _kept(self, events: list[OutputEvent]) -> list[OutputEvent]:
        if self.check is not None:
            self.check.see(events)
        return events

    def _feed(self, event: TokenGenerated) -> list[OutputEvent]:
        if self._reasoning is None and self._tools is None:
            logprobs = () if event.logprob is None else (event.logprob,)
            return [TextDelta(text=event.text, token_ids=(event.token_id,), logprobs=logprobs)]
        was_reasoning = self._reasoning is not None and self._reasoning.in_reasoning
        events = self._route(
            self._split(self._reasoning.feed(event.text), event.text)
            if self._reasoning
            else [TextDelta(text=event.text)]
        )
        if was_reasoning or any(isinstance(e, ReasoningDelta) for e in events):
            self.reasoning_tokens += 1
        if event.logprob is not None:
            events = _attach_logprob(events, event)
        return self._assign_tokens(events, event.token_id)

    def _assign_tokens(self, events: list[OutputEvent], token_id: int) -> list[OutputEvent]:
        """Put the ids of the tokens not yet shown on the first text this token released (if any).

        A text that holds the token's logprob holds its id already: it takes them.
        """
        self._unassigned.append(token_id)
        target: int | None = None
        for index, event in enumerate(events):
            if isinstance(event, TextDelta) and event.token_ids:
                target = index
                break
            if target is None and isinstance(event, TextDelta | ReasoningDelta):
                target = index
        if target is None:
            return events
        delta = events[target]
        assert isinstance(delta, TextDelta | ReasoningDelta)
        events[target] = attrs.evolve(delta, token_ids=tuple(self._unassigned))
        self._unassigned.clear()
        return events

    def _split(self, parsed: list[OutputEvent], raw: str) -> list[OutputEvent]:
        """The reasoning parser's events; with ``reasoning_in_content``, its reasoning plus the raw text."""
        if not self._reasoning_in_content:
            return parsed
        kept: list[OutputEvent] = [e for e in parsed if isinstance(e, ReasoningDelta)]
        return [*kept, TextDelta(text=raw)]

    def finish(self) -> list[OutputEvent]:
        parsed = self._reasoning.finish() if self._reasoning else []
        if self._reasoning_in_content:  # the raw text went out already
            parsed = [e for e in parsed if isinstance(e, ReasoningDelta)]
        flushed = self._route(parsed)
        if self._tools is not None:
            flushed += self._tools.finish()
        self.called_tools = self.called_tools or any(
            not isinstance(e, TextDelta | ReasoningDelta) for e in flushed
        )
        return self._kept(flushed)

    def _route(self, events: list[OutputEvent]) -> list[OutputEvent]:
        if self._tools is None:
            return events
        out: list[OutputEvent] = []
        for event in events:
            out.extend(self._tools.feed(event.text) if isinstance(event, TextDelta) else [event])
        self.called_tools = self.called_tools or any(
            not isinstance(e, TextDelta | ReasoningDelta) for e in out
        )
        return out


def _attach_logprob(events: list[OutputEvent], token: TokenGenerated) -> list[OutputEvent]:
    """Put the token's log-probability on the first answer text it produced (if any)."""
    assert token.logprob is not None
    for index, event in enumerate(events):
        if isinstance(event, TextDelta):
            events[index] = attrs.evolve(event, token_ids=(token.token_id,), logprobs=(token.logprob,))
            break
    return events


async def output_events(
    events: AsyncIterator[EngineEvent], plan: OutputPlan
) -> AsyncGenerator[OutputEvent, None]:
    """The parsed output of one generation, ending with :class:`Done`."""
    pipeline = _Pipeline(plan)
    async for event in events:
        match event:
            case TokenGenerated():
                for output in pipeline.feed(event):
                    yield output
            case PromptProgress():
                yield event
            case GenerationFinished(cause=cause, stats=stats, stop_word=stop_word):
                for output in pipeline.finish():
                    yield output
                if pipeline.check is not None and cause is StopCause.EOS:
                    # off the event loop: a long answer takes a while to read and check
                    await trio.to_thread.run_sync(pipeline.check.check)
                yield Done(
                    finish_reason=finish_reason_for(cause, called_tools=pipeline.called_tools),
                    cause=cause,
                    stats=stats,
                    stop_word=stop_word,
                    reasoning_tokens=pipeline.reasoning_tokens,
                    raw_text="".join(pipeline.raw),
                )
                return
            case GenerationFailed(error=error):
                raise error
    raise EngineFailure("the generation ended without a result")
