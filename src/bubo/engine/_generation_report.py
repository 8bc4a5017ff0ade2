"""What a generation reports as it goes: its prompt's progress, its timings and how it ended.

The client hears of the prompt's progress (``PromptProgress``: llama-server's
first report before any prompt token is decoded, then one a chunk) and of the
end (``GenerationFinished`` with the request's statistics); the slot hears of
the cached prefix and of how long the prompt and the generation took.  The
counts come from the generation's parts (:class:`PromptFeeder`,
:class:`EndPolicy`, :class:`DraftVerifier`), read when reported.

Decode thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from bubo.domain.generation import (
    CacheReport,
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStats,
    PromptProgress,
    StopCause,
)

from ._draft_verifier import DraftVerifier
from ._end_policy import EndPolicy
from ._prompt_feeder import PromptFeeder
from .slots import Slot

__all__ = ["GenerationReport", "Outcome"]


@attrs.frozen(kw_only=True)
class Outcome:
    """How a generation ended and what drafting did."""

    n_generated: int
    cause: StopCause
    stop_word: str | None = None
    drafted: int = 0
    accepted: int = 0
    # the last generated token, when it ended the generation unevaluated; None when it was evaluated,
    # or when a stop string found a step late ended it (its cell then depends on the decode that ran)
    undecoded: int | None = None
    shifted: bool = False  # the context was shifted (the cache no longer holds prompt and answer)


@attrs.define(kw_only=True)
class GenerationReport:
    """One generation's progress and end, told to its client (events) and its slot (timings)."""

    request: GenerationRequest
    slot: Slot
    feeder: PromptFeeder
    ending: EndPolicy
    verifier: DraftVerifier
    emit: Callable[[EngineEvent], None]
    _cache: CacheReport = attrs.field(init=False, factory=CacheReport)
    _started: float = attrs.field(init=False, default=0.0)
    _prompt_done: float = attrs.field(init=False, default=0.0)

    def begin(self) -> None:
        """The generation starts now (its prompt's time counts from here)."""
        self._started = time.perf_counter()

    def reused(self, cache: CacheReport) -> None:
        """The cached prefix was taken (*cache* says how): llama-server's first progress report."""
        self._cache = cache
        feeder = self.feeder
        self.slot.reused(feeder.n_cached, shared=cache.shared_tokens)
        self.emit(
            PromptProgress(
                total=len(self.request.prompt_tokens),
                cached=feeder.n_cached,
                processed=0,
                elapsed_ms=0.0,
                slot_id=self.slot.id,
            )
        )

    def chunk_read(self, n_tokens: int) -> None:
        """*n_tokens* more of the prompt were evaluated (the feeder has read them)."""
        feeder = self.feeder
        self.slot.evaluated(n_tokens)
        now = time.perf_counter()
        self.emit(
            PromptProgress(
                total=len(self.request.prompt_tokens),
                cached=feeder.n_cached,
                processed=feeder.processed,
                elapsed_ms=(now - self._started) * 1000.0,
                slot_id=self.slot.id,
            )
        )
        if not feeder.prefilling:
            self._prompt_took(now)

    def outcome(self, cause: StopCause, *, undecoded: int | None) -> Outcome:
        """How the generation ended, for *cause* (*undecoded*: its last token, not in the KV cache)."""
        ending, verifier = self.ending, self.verifier
        return Outcome(
            n_generated=ending.n_generated,
            cause=cause,
            stop_word=ending.stop_word,
            drafted=verifier.drafted,
            accepted=verifier.accepted,
            undecoded=undecoded,
            shifted=self.feeder.shifts > 0,
        )

    def finished(self, outcome: Outcome) -> None:
        """The generation ended as *outcome* says: its timings to the slot, its last event to the client."""
        now = time.perf_counter()
        if not self._prompt_done:  # ended before its prompt was evaluated (the context filled up)
            self._prompt_took(now)
        predicted_ms = (now - self._prompt_done) * 1000.0
        self.slot.generation_took(predicted_ms / 1000.0)
        feeder = self.feeder
        self.emit(
            GenerationFinished(
                cause=outcome.cause,
                stop_word=outcome.stop_word,
                stats=GenerationStats(
                    prompt_tokens=len(self.request.prompt_tokens),
                    cached_tokens=feeder.n_cached,
                    prompt_ms=(self._prompt_done - self._started) * 1000.0,
                    completion_tokens=outcome.n_generated,
                    predicted_ms=predicted_ms,
                    draft_tokens=outcome.drafted,
                    draft_accepted=outcome.accepted,
                    cache=self._cache,
                    slot_id=self.slot.id,
                    context_shifts=feeder.shifts,
                ),
            )
        )

    def _prompt_took(self, now: float) -> None:
        self._prompt_done = now
        self.slot.prompt_took(now - self._started)
