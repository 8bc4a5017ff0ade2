"""Usage and timings as OpenAI-style and llama-server responses report them.

Shared by the ``openai`` and ``llamacpp`` dialects (llama-server puts the same
``usage`` and ``timings`` on both); built from the domain's
:class:`~bubo.domain.generation.GenerationStats` in one place.
"""

from __future__ import annotations

import attrs

from bubo.domain.generation import GenerationStats

__all__ = ["CompletionTokensDetails", "Gufo", "PromptTokensDetails", "Timings", "Usage", "timings", "usage"]


@attrs.frozen(kw_only=True)
class PromptTokensDetails:
    """Prompt tokens reused from the cache, and how many of them came from another slot's cells."""

    cached_tokens: int
    shared_tokens: int


@attrs.frozen(kw_only=True)
class CompletionTokensDetails:
    """Reasoning and speculative-decoding token counts."""

    reasoning_tokens: int
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


@attrs.frozen(kw_only=True)
class Gufo:
    """Bubo's prompt-cache report (``usage.gufo``)."""

    cache_hit: bool
    cache_miss_reason: str | None
    cached_tokens: int
    cache_snapshots_skipped: int
    cache_restored_bytes: int


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts, speeds, draft tokens and the cache report."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails
    prompt_tokens_per_second: float
    completion_tokens_per_second: float
    draft_tokens: int
    draft_tokens_accepted: int
    gufo: Gufo


@attrs.frozen(kw_only=True)
class Timings:
    """llama-server's ``timings``; ``draft_*`` only when drafting ran."""

    cache_n: int
    shared_tokens: int  # of cache_n, the tokens taken from another slot's cells
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int | None = None
    draft_n_accepted: int | None = None


def usage(stats: GenerationStats, *, reasoning_tokens: int = 0) -> Usage:
    """The ``usage`` object for one generation."""
    rejected = stats.draft_tokens - stats.draft_accepted
    return Usage(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.completion_tokens,
        total_tokens=stats.prompt_tokens + stats.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=stats.cached_tokens, shared_tokens=stats.cache.shared_tokens
        ),
        completion_tokens_details=CompletionTokensDetails(
            reasoning_tokens=reasoning_tokens,
            accepted_prediction_tokens=stats.draft_accepted,
            rejected_prediction_tokens=rejected,
        ),
        prompt_tokens_per_second=round(stats.prompt_per_second, 3),
        completion_tokens_per_second=round(stats.predicted_per_second, 3),
        draft_tokens=stats.draft_tokens,
        draft_tokens_accepted=stats.draft_accepted,
        gufo=Gufo(
            cache_hit=stats.cache.hit,
            cache_miss_reason=stats.cache.miss_reason,
            cached_tokens=stats.cached_tokens,
            cache_snapshots_skipped=stats.cache.snapshots_skipped,
            cache_restored_bytes=stats.cache.restored_bytes,
        ),
    )


def timings(stats: GenerationStats) -> Timings:
    """llama-server's ``timings`` for one generation.

    The rates are over the times as shown (in ms, to 3 decimals), so a client computing them from the
    answer gets the same numbers; the generation's are over its decode steps, which the first token
    (sampled from the prompt's logits) does not take, as in llama-server: one token has rate 0.
    """
    prompt_n = stats.evaluated_tokens
    prompt_ms = round(stats.prompt_ms, 3)
    steps = stats.decoded_tokens
    predicted_ms = round(stats.predicted_ms, 3)
    drafted = stats.draft_tokens > 0
    return Timings(
        cache_n=stats.cached_tokens,
        shared_tokens=stats.cache.shared_tokens,
        prompt_n=prompt_n,
        prompt_ms=prompt_ms,
        prompt_per_token_ms=prompt_ms / prompt_n if prompt_n else 0.0,
        prompt_per_second=prompt_n * 1000.0 / prompt_ms if prompt_ms > 0 else 0.0,
        predicted_n=stats.completion_tokens,
        predicted_ms=predicted_ms,
        predicted_per_token_ms=predicted_ms / steps if steps else 0.0,
        predicted_per_second=steps * 1000.0 / predicted_ms if predicted_ms > 0 else 0.0,
        draft_n=stats.draft_tokens if drafted else None,
        draft_n_accepted=stats.draft_accepted if drafted else None,
    )
