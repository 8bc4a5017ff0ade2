"""Streamed prompt progress and per-token timings, as llama-server sends them.

``prompt_progress`` (``return_progress``) and ``timings`` on every chunk
(``timings_per_token``), shared by ``/completion`` and the chat completions stream.
"""

from __future__ import annotations

import time

import attrs

from bubo.domain.generation import GenerationStats, PromptProgress
from bubo.domain.output import OutputEvent, ReasoningDelta, TextDelta

from ._usage import Timings, timings

__all__ = ["LiveTimings", "Progress", "progress"]


@attrs.frozen(kw_only=True)
class Progress:
    """``prompt_progress``: ``processed`` of ``total`` prompt tokens, ``cache`` of them reused.

    ``processed`` counts the reused tokens too, as llama-server's does: the overall progress is
    ``processed / total``, the evaluation's own ``(processed - cache) / (total - cache)``.
    """

    total: int
    cache: int
    processed: int
    time_ms: float


def progress(event: PromptProgress) -> Progress:
    """The wire form of a prompt progress event."""
    return Progress(
        total=event.total,
        cache=event.cached,
        processed=event.cached + event.processed,
        time_ms=round(event.elapsed_ms, 3),
    )


class LiveTimings:
    """The timings of a generation so far, as each chunk reports them with ``timings_per_token``.

    The prompt's come from its progress events (``prompt_n`` the tokens evaluated so far: 0 in the
    first, sent before any is); the generation's count the answer's tokens and the time since the
    prompt was read.
    """

    def __init__(self) -> None:
        self._processed = 0
        self._cached = 0
        self._prompt_ms = 0.0
        self._generating_since: float | None = None
        self._generated = 0

    def saw(self, event: OutputEvent) -> None:
        """Account for one output event."""
        match event:
            case PromptProgress():
                self._processed, self._cached = event.processed, event.cached
                self._prompt_ms = event.elapsed_ms
                if event.cached + event.processed >= event.total:
                    self._generating_since = time.perf_counter()
            case TextDelta(token_ids=token_ids) | ReasoningDelta(token_ids=token_ids):
                self._generated += len(token_ids)

    def now(self) -> Timings:
        """``timings`` as of now."""
        since = self._generating_since
        return timings(
            GenerationStats(
                prompt_tokens=self._cached + self._processed,
                cached_tokens=self._cached,
                prompt_ms=self._prompt_ms,
                completion_tokens=self._generated,
                predicted_ms=0.0 if since is None else (time.perf_counter() - since) * 1000.0,
            )
        )
