"""What the engine is asked to do, and what it reports back while doing it."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from .media import PlacedImage
from .sampling import DraftLimits, SamplingParams

__all__ = [
    "CacheReport",
    "CacheTags",
    "EngineEvent",
    "GenerationFailed",
    "GenerationFinished",
    "GenerationRequest",
    "GenerationStats",
    "GrammarSpec",
    "PromptProgress",
    "StopCause",
    "ThinkingBudget",
    "TokenGenerated",
    "TokenLogprob",
    "TopLogprob",
]


@attrs.frozen(kw_only=True)
class GrammarSpec:
    """A GBNF grammar whose rules may use rules the engine derives from JSON schemas.

    ``rules`` defines ``root``; each ``(name, schema)`` in ``schemas`` becomes
    rule ``name`` (llama.cpp's JSON-schema-to-grammar conversion).
    """

    rules: str
    schemas: tuple[tuple[str, Mapping[str, Any]], ...] = ()


@attrs.frozen(kw_only=True)
class ThinkingBudget:
    """End thinking after ``budget`` generated tokens by inserting ``end_tokens``.

    Applies only once thinking has begun: at once when ``started``, else when
    the output contains ``start_text``; never once ``end_text`` was generated.
    ``end_tokens`` is the closing markup (``end_text`` on a line of its own) as
    the service's tokenizer reads it, so the engine inserts what prompts hold.
    """

    budget: int
    end_tokens: tuple[int, ...]
    start_text: str = "<think>"
    end_text: str = "</think>"
    started: bool = False


@attrs.frozen(kw_only=True)
class CacheTags:
    """Who a prompt belongs to, for the prompt cache's miss reasons.

    ``conversation`` identifies the conversation (a hash of its opening turns);
    ``template`` how it was rendered (template, variables, tools).  The same
    conversation rendered differently is a ``template_changed`` miss.
    """

    conversation: str
    template: str


@attrs.frozen(kw_only=True)
class GenerationRequest:
    """One decode job: prompt token ids in, about ``max_new_tokens`` tokens out.

    ``max_new_tokens`` ``None`` means "until an end-of-generation token or the end
    of the context"; a limit reached inside a multi-byte character is passed by
    the (at most three) tokens that finish it.  ``n_probs`` ``None`` computes no log-probabilities; ``0``
    computes only the sampled token's, ``k`` adds the top ``k`` alternatives.
    ``time_limit_ms`` bounds the generation phase (llama-server's
    ``t_max_predict_ms``); ``0`` disables it.  ``continuation`` is what the next
    prompt of the conversation will most likely hold right after this output
    (the chat template's end of turn and next header): the engine evaluates it
    while idle, so the next turn starts warm.  ``slot`` pins the session slot.

    When the engine shifts the context (``--context-shift``) to go on past its
    end, it keeps the first ``n_keep`` prompt tokens (after a BOS; ``-1``: the
    whole prompt) and drops half of the rest.  ``cache_prompt`` false evaluates
    the whole prompt afresh.  ``n_indent`` above 0 ends the generation (cause
    ``LIMIT``) at the first line after a new line indented by fewer blanks.
    """

    prompt_tokens: tuple[int, ...]
    max_new_tokens: int | None
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n_probs: int | None = None
    time_limit_ms: int = 0
    grammar: str | None = None  # GBNF text, from Engine.compile_grammar
    thinking_budget: ThinkingBudget | None = None
    cache_tags: CacheTags | None = None
    continuation: tuple[int, ...] = ()
    slot: int | None = None  # the session slot to run in (llama-server's id_slot); None: the engine picks
    # llama-server's n_keep, cache_prompt and n_indent (see the class's docstring)
    n_keep: int = 0
    cache_prompt: bool = True
    n_indent: int = 0
    post_sampling_probs: bool = False  # n_probs' probabilities after the sampler chain, not the raw softmax
    speculative: DraftLimits = attrs.field(factory=DraftLimits)  # how it may draft, if the engine drafts
    # each loaded LoRA adapter's scale, by id (0: not applied); None: the engine's scales when it starts
    lora: tuple[float, ...] | None = None
    # images whose embedding positions the prompt holds (stand-in ids in ``prompt_tokens``), in order
    images: tuple[PlacedImage, ...] = ()


@attrs.frozen(kw_only=True)
class TopLogprob:
    """One candidate token and its log-probability."""

    token_id: int
    piece: bytes
    logprob: float


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """The sampled token's log-probability and the most likely alternatives."""

    token_id: int
    piece: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class StopCause(enum.Enum):
    """Why the engine stopped generating."""

    EOS = "eos"  # the model produced an end-of-generation token
    STOP_WORD = "word"  # a stop string matched
    LIMIT = "limit"  # max_new_tokens reached
    CONTEXT = "context"  # the context window is full
    TIME = "time"  # time_limit_ms passed

    @property
    def truncated(self) -> bool:
        """Whether a limit cut the output short (as opposed to the model or a stop string ending it)."""
        return self in (StopCause.LIMIT, StopCause.CONTEXT, StopCause.TIME)


@attrs.frozen(kw_only=True)
class CacheReport:
    """What the prompt cache did for one request (``usage.gufo``).

    ``miss_reason`` is ``None`` on a hit, else ``cold`` (nothing cached yet),
    ``no_prefix`` (the cache held an unrelated prompt), ``evicted`` (a matching
    snapshot was dropped for room), ``template_changed`` or ``disabled``.
    """

    hit: bool = False
    miss_reason: str | None = "cold"
    snapshots_skipped: int = 0
    restored_bytes: int = 0
    shared_tokens: int = 0  # of the reused prefix, tokens whose cells another slot's sequence held


@attrs.frozen(kw_only=True)
class GenerationStats:
    """Counts and times of one generation (llama-server's ``timings``).

    ``cached_tokens`` prompt tokens were reused from the KV cache; the other
    ``prompt_tokens - cached_tokens`` were evaluated in ``prompt_ms``.
    """

    prompt_tokens: int
    cached_tokens: int = 0
    prompt_ms: float = 0.0
    completion_tokens: int = 0
    predicted_ms: float = 0.0
    draft_tokens: int = 0
    draft_accepted: int = 0
    cache: CacheReport = attrs.field(factory=CacheReport)
    slot_id: int = 0  # the session slot the generation ran in
    context_shifts: int = 0  # times the context was shifted to go on past its end (llama-server's truncated)

    @property
    def evaluated_tokens(self) -> int:
        """Prompt tokens that had to be evaluated (not found in the cache)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def prompt_per_second(self) -> float:
        """Prompt evaluation speed in tokens per second (0 when nothing was evaluated)."""
        return _per_second(self.evaluated_tokens, self.prompt_ms)

    @property
    def decoded_tokens(self) -> int:
        """Generated tokens that cost a decode step: all but the first, sampled from the prompt's logits."""
        return max(self.completion_tokens - 1, 0)

    @property
    def predicted_per_second(self) -> float:
        """Generation speed in tokens per second, over the decode steps (the first token costs none)."""
        return _per_second(self.decoded_tokens, self.predicted_ms)


def _per_second(count: int, ms: float) -> float:
    return count * 1000.0 / ms if ms > 0 else 0.0


@attrs.frozen(kw_only=True)
class PromptProgress:
    """The prompt is being evaluated: ``processed`` of ``total`` tokens done."""

    total: int
    cached: int
    processed: int
    elapsed_ms: float
    slot_id: int = 0  # the session slot evaluating it


@attrs.frozen(kw_only=True)
class TokenGenerated:
    """One sampled token.

    ``text`` is the text it releases: possibly empty while a multi-byte
    character or a possible stop string is incomplete, possibly more than the
    token's own piece when held-back text is released.
    """

    token_id: int
    text: str
    logprob: TokenLogprob | None = None


@attrs.frozen(kw_only=True)
class GenerationFinished:
    """The last event of every generation that was not cancelled."""

    cause: StopCause
    stats: GenerationStats
    stop_word: str | None = None


@attrs.frozen(kw_only=True)
class GenerationFailed:
    """The engine could not finish; ``error`` is what the consumer should raise."""

    error: Exception


EngineEvent = PromptProgress | TokenGenerated | GenerationFinished | GenerationFailed
