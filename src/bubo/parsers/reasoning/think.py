"""``<think>…</think>`` reasoning, split from the answer as it streams.

The output may open ``<think>`` itself (after optional whitespace), or the
prompt may already have opened it (Qwen3-style templates with thinking on end
the prompt inside ``<think>``), in which case the output starts in reasoning.
Whitespace around the reasoning and at the start of the answer after
``</think>`` is dropped; partial markers are held back, never leaked.

Each character is read about once: held white space (before the output says
whether it thinks, or at the end of the reasoning so far) is kept aside and
not searched again, which needs markers that do not start with white space.
"""

from __future__ import annotations

import enum

from bubo.domain.output import OutputEvent, ReasoningDelta, TextDelta
from bubo.parsers.base import hold_partial

__all__ = ["ThinkParser"]


class _Mode(enum.Enum):
    START = "start"  # nothing but whitespace yet: the output may still open <think>
    REASONING = "reasoning"
    ANSWER = "answer"


class ThinkParser:
    """Splits ``<think>`` reasoning from the answer."""

    def __init__(self, *, starts_inside: bool = False, start: str = "<think>", end: str = "</think>") -> None:
        self._start = start
        self._end = end
        self._mode = _Mode.REASONING if starts_inside else _Mode.START
        self._held = ""  # a partial marker
        self._space: list[str] = []  # white space held back before it (START, REASONING)
        self._skip_space = starts_inside  # drop whitespace at the start of reasoning / answer

    @property
    def in_reasoning(self) -> bool:
        """Whether text fed now would be reasoning."""
        return self._mode is _Mode.REASONING

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume text; return reasoning and answer deltas."""
        events: list[OutputEvent] = []
        pending = self._held + text
        self._held = ""
        while pending:
            pending = self._step(pending, events)
        return events

    def _step(self, pending: str, events: list[OutputEvent]) -> str:
        """Handle as much of *pending* as the mode allows; return what the next mode gets."""
        if self._mode is _Mode.START:
            return self._opening(pending)
        if self._skip_space:
            pending = pending.lstrip()
            if not pending:
                return ""
            self._skip_space = False
        if self._mode is _Mode.ANSWER:
            events.append(TextDelta(text=pending))
            return ""
        return self._reasoning_text(pending, events)

    def _opening(self, pending: str) -> str:
        """Decide, before anything but whitespace, whether the output opens ``<think>``."""
        stripped = pending.lstrip()
        if stripped.startswith(self._start):
            self._mode = _Mode.REASONING
            self._skip_space, self._space = True, []
            return stripped[len(self._start) :]
        if not stripped or self._start.startswith(stripped):
            self._space.append(pending[: len(pending) - len(stripped)])
            self._held = stripped
            return ""
        self._mode = _Mode.ANSWER
        space, self._space = "".join(self._space), []
        return space + pending

    def _reasoning_text(self, pending: str, events: list[OutputEvent]) -> str:
        """Reasoning up to ``</think>``; a possible partial marker and trailing space are held."""
        index = pending.find(self._end)
        if index != -1:
            reasoning = pending[:index].rstrip()
            if reasoning:
                events.append(ReasoningDelta(text="".join(self._space) + reasoning))
            self._mode, self._space = _Mode.ANSWER, []
            self._skip_space = True
            return pending[index + len(self._end) :]
        keep = hold_partial(pending, self._end)
        body, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        release = body.rstrip()
        if release:
            events.append(ReasoningDelta(text="".join(self._space) + release))
            self._space = []
        self._space.append(body[len(release) :])
        return ""

    def finish(self) -> list[OutputEvent]:
        """Release what was held: unfinished reasoning stays reasoning, the rest is answer."""
        held, self._held = "".join(self._space) + self._held, ""
        self._space = []
        if self._mode is _Mode.REASONING:
            held = held.strip() if self._skip_space else held.rstrip()
            return [ReasoningDelta(text=held)] if held else []
        if self._mode is _Mode.START:
            return [TextDelta(text=held)] if held.strip() else []
        return [TextDelta(text=held)] if held else []
