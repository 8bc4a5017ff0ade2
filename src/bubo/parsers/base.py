"""The parser interface and its configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from bubo.domain.ids import new_tool_call_id
from bubo.domain.messages import ToolSpec
from bubo.domain.output import OutputEvent

__all__ = ["ParserConfig", "StreamParser", "hold_partial"]


class StreamParser(Protocol):
    """A sans-IO parser over streamed text."""

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume generated text; return the events it completes."""
        ...

    def finish(self) -> list[OutputEvent]:
        """The generation ended: flush everything held back."""
        ...


@attrs.frozen(kw_only=True)
class ParserConfig:
    """What a tool-call parser needs to know about the request.

    ``max_calls`` ``None`` allows any number of calls (``parallel_tool_calls``);
    ``1`` keeps the first call and drops the rest.  ``new_id`` makes call ids
    (tests pass a deterministic one).
    """

    tools: tuple[ToolSpec, ...] = ()
    max_calls: int | None = None
    new_id: Callable[[], str] = new_tool_call_id

    def tool(self, name: str) -> ToolSpec | None:
        """The offered tool called *name*."""
        return next((t for t in self.tools if t.name == name), None)


def hold_partial(text: str, marker: str) -> int:
    """Length of the longest suffix of *text* that is a proper prefix of *marker*."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
