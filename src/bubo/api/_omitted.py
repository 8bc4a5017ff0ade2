"""Content a text model cannot read, replaced by a placeholder so a session goes on.

An image, PDF, audio clip or file in an earlier turn, a tool result or a
function call's output becomes one line of text naming what was left out
(:data:`PLACEHOLDERS`), counted like any other text.  Only such content in the
newest user turn, typed by the user, is refused (400 ``unsupported_content``):
the user can still act on that.  Each dialect's translation counts what it
replaced in the request's ``omitted`` mapping; :func:`report_omitted` logs it
and answers with the ``Bubo-Omitted-Content`` header (``image=2, document=1``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from quart import after_this_request
from quart.typing import ResponseTypes

__all__ = ["OMITTED_HEADER", "PLACEHOLDERS", "Omissions", "report_omitted"]

logger = logging.getLogger(__name__)

OMITTED_HEADER = "Bubo-Omitted-Content"
PLACEHOLDERS = {
    kind: f"[{kind} omitted: this model reads text only]" for kind in ("image", "document", "audio", "file")
}


class Omissions:
    """What one request's translation replaced, by kind."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def placeholder(self, kind: str) -> str:
        """The text standing for one omitted item of *kind* (``image``, ``document``, ``audio``, ``file``)."""
        self._counts[kind] += 1
        return PLACEHOLDERS[kind]

    def counts(self) -> dict[str, int]:
        """How many items of each kind were replaced."""
        return dict(sorted(self._counts.items()))


def report_omitted(omitted: Mapping[str, int]) -> None:
    """Log a warning and set the response header when a request's content was replaced (call in a handler)."""
    if not omitted:
        return
    summary = ", ".join(f"{kind}={count}" for kind, count in omitted.items())
    logger.warning("content this text model cannot read was replaced by a placeholder: %s", summary)

    @after_this_request
    def _header(response: ResponseTypes) -> ResponseTypes:
        response.headers[OMITTED_HEADER] = summary
        return response
