"""One request's generation on the decode thread, composed of one part per concern.

The decode loop (:mod:`._decode_loop`) asks every active generation for its
part of the next batch (a chunk of prompt while prefilling, the last sampled
token while generating), evaluates all parts in one decode, then hands each
generation the batch index of its part, where its logits are.  The generation
samples the next token there and reports facts to its slot; the rest is its
parts':

- :class:`PromptFeeder`: the prompt's position (after the cached prefix) and
  the sequence's room, shifting the context where allowed;
- :class:`EndPolicy`: when the generation ends and why, the text each token
  releases, and when the end of thinking is inserted;
- :class:`ProbabilityRecorder`: each token's log-probabilities, if asked for;
- :class:`DraftVerifier` and a :class:`DraftSource` (a draft model's
  :class:`ModelDrafts` when the engine has one, else prompt lookup's): drafts to
  verify while the generation is alone in the batch, within the request's
  ``speculative`` limits.

Tokens to insert (the end of thinking) replace sampling while the grammar
admits them; one it forbids gives the insertion up.  Written against the
:mod:`._protocols`, so it runs with a scripted context and sampler.
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
    TokenGenerated,
)

from ._draft_policy import DraftPolicy
from ._draft_verifier import DraftSource, DraftVerifier, LookupDrafts
from ._end_policy import EndPolicy
from ._kv_plan import DiskOffer
from ._model_drafts import Drafter
from ._probabilities import ProbabilityRecorder
from ._prompt_feeder import PromptFeeder
from ._protocols import BatchEntry, DecodeContext, KvSequence, SamplerFactory, TokenSampler
from .base import EngineFailure
from .lora import AdapterSet, adapter_set
from .slots import Slot

__all__ = ["EngineSetup", "Generation", "Outcome"]


@attrs.frozen(kw_only=True)
class Outcome:
    """How a generation ended and what drafting did."""

    n_generated: int
    cause: StopCause
    stop_word: str | None = None
    drafted: int = 0
    accepted: int = 0
    undecoded: int | None = None  # the last generated token, when it is not in the KV cache
    shifted: bool = False  # the context was shifted (the cache no longer holds prompt and answer)


@attrs.frozen(kw_only=True)
class EngineSetup:
    """What an engine gives each of its generations: the context, the model's facts, its policies."""

    context: DecodeContext
    pieces: list[bytes]  # each token's bytes
    eog: frozenset[int]  # the end-of-generation tokens
    sampler: SamplerFactory
    drafting: DraftPolicy | None = None  # drafting statistics, shared by the engine's generations
    drafter: Drafter | None = None  # the draft model (its policy is ``drafting``); None: prompt lookup
    context_shift: bool = False  # go on past the end of the context (llama-server's --context-shift)


class Generation:
    """The state of one request's generation in its slot's KV sequence (decode thread only)."""

    def __init__(
        self,
        setup: EngineSetup,
        slot: Slot,
        request: GenerationRequest,
        *,
        emit: Callable[[EngineEvent], None],
        offer: DiskOffer | None = None,
    ) -> None:
        """*emit* reports to the trio thread; *offer*: the disk file read for this request, its alone."""
        context = setup.context
        self.request = request
        self.slot = slot
        self.cache: KvSequence = context.caches[slot.id]
        self.cancelled = False  # set on the trio thread; the loop drops the generation at its next step
        self.outcome: Outcome | None = None
        self._context = context
        self._pieces = setup.pieces
        self._emit = emit
        self._make_sampler = setup.sampler
        self._sampler: TokenSampler | None = None
        self._feeder = PromptFeeder(
            request,
            self.cache,
            n_ctx=context.n_ctx_seq,
            bos=context.bos,
            shift=setup.context_shift,
            offer=offer,
        )
        self._ending = EndPolicy(
            request,
            eog=setup.eog,
            n_ctx_train=context.n_ctx_train,
            fits=self._feeder.fits,
            shifts=setup.context_shift and not request.images,
        )
        self._probabilities = ProbabilityRecorder(request, context, setup.pieces)
        self._policy = setup.drafting
        self._drafter = setup.drafter
        self._drafts: DraftSource | None = None
        self._verifier = DraftVerifier()
        self._insert: list[int] = []  # tokens inserted instead of sampled (the end of thinking)
        self._token: int | None = None  # sampled and emitted, not yet evaluated
        self._draft: tuple[int, ...] = ()
        self._walk_ended: StopCause | None = None  # what ended the generation during a draft's walk
        self._cache_report = CacheReport()
        self._started = self._prompt_done = 0.0
        self._adapters = adapter_set(request.lora or ())

    # ---- what the loop asks ------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the generation ended (its outcome is set)."""
        return self.outcome is not None

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to evaluate."""
        return self._feeder.prefilling

    @property
    def adapters(self) -> AdapterSet:
        """The LoRA adapter set the generation decodes under."""
        return self._adapters

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to evaluate."""
        return self._feeder.left

    def start(self) -> None:
        """Reuse the slot's cached prefix of the prompt (or a snapshot's) and build the sampler.

        Raises:
            EngineFailure: the prompt does not fit the context, or the grammar does not load.

        """
        request, context = self.request, self._context
        prompt = request.prompt_tokens
        if not prompt or len(prompt) >= context.n_ctx_seq:  # the service checks first; this guards
            msg = f"prompt of {len(prompt)} tokens cannot be evaluated in a {context.n_ctx_seq}-token context"
            raise EngineFailure(msg)
        self._started = time.perf_counter()
        self._sampler = self._make_sampler(request)
        # an image's stand-in ids are no tokens: the penalties see the prompt's text only
        self._sampler.remember([token for token in prompt if token >= 0] if request.images else prompt)
        self._drafts = self._draft_source()
        feeder = self._feeder
        self._cache_report = feeder.reuse()
        self.slot.reused(feeder.n_cached, shared=self._cache_report.shared_tokens)
        self.slot.holds(len(self.cache.tokens))
        # llama-server's first progress report, before any prompt token is decoded
        self._emit(
            PromptProgress(
                total=len(prompt), cached=feeder.n_cached, processed=0, elapsed_ms=0.0, slot_id=self.slot.id
            )
        )

    def _draft_source(self) -> DraftSource | None:
        """The draft model's drafts if the engine has one, else prompt lookup's (None: no drafting)."""
        request = self.request
        if request.speculative.n_max <= 0 or request.images:  # drafts know nothing of an image's positions
            return None
        if self._drafter is not None:
            return self._drafter.drafts(self.slot.id, request.prompt_tokens, p_min=request.speculative.p_min)
        if self._policy is not None:
            return LookupDrafts(request.prompt_tokens, self._policy)
        return None

    def prompt_entry(self, room: int) -> BatchEntry:
        """Up to *room* prompt tokens for the next batch (logits after the prompt's last)."""
        return self._feeder.chunk(room)

    def token_entry(self, *, alone: bool) -> BatchEntry:
        """The token to evaluate next, with a draft after it when the generation is *alone* in the batch."""
        assert self._token is not None
        self._feeder.make_room()
        self._draft = self._next_draft() if alone else ()
        return BatchEntry(self.cache, (self._token, *self._draft), all_logits=bool(self._draft))

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*: take the next token, or account for the prompt."""
        self.slot.holds(len(self.cache.tokens))
        if self._token is None:  # no token yet: the entry was a prompt chunk
            self._after_prompt_chunk(len(entry.tokens), index)
        elif self._draft:
            self._after_draft(index)
        else:
            self._begin(self._next(index), index)

    def finish(self, cause: StopCause, *, undecoded: int | None = None) -> None:
        """End the generation: emit its last event and free the sampler."""
        now = time.perf_counter()
        if not self._prompt_done:  # ended before its prompt was evaluated (the context filled up)
            self._prompt_took(now)
        predicted_ms = (now - self._prompt_done) * 1000.0
        self.slot.generation_took(predicted_ms / 1000.0)
        self.close()
        ending, verifier, feeder = self._ending, self._verifier, self._feeder
        self.outcome = Outcome(
            n_generated=ending.n_generated,
            cause=cause,
            stop_word=ending.stop_word,
            drafted=verifier.drafted,
            accepted=verifier.accepted,
            undecoded=undecoded,
            shifted=feeder.shifts > 0,
        )
        self._emit(
            GenerationFinished(
                cause=cause,
                stop_word=ending.stop_word,
                stats=GenerationStats(
                    prompt_tokens=len(self.request.prompt_tokens),
                    cached_tokens=feeder.n_cached,
                    prompt_ms=(self._prompt_done - self._started) * 1000.0,
                    completion_tokens=ending.n_generated,
                    predicted_ms=predicted_ms,
                    draft_tokens=verifier.drafted,
                    draft_accepted=verifier.accepted,
                    cache=self._cache_report,
                    slot_id=self.slot.id,
                    context_shifts=feeder.shifts,
                ),
            )
        )

    def close(self) -> None:
        """Free the sampler (the generation ended, failed or was abandoned)."""
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    # ---- the prompt --------------------------------------------------------------------------

    def _after_prompt_chunk(self, n_tokens: int, index: int) -> None:
        feeder = self._feeder
        feeder.read(n_tokens)
        self.slot.evaluated(n_tokens)
        now = time.perf_counter()
        self._emit(
            PromptProgress(
                total=len(self.request.prompt_tokens),
                cached=feeder.n_cached,
                processed=feeder.processed,
                elapsed_ms=(now - self._started) * 1000.0,
                slot_id=self.slot.id,
            )
        )
        if feeder.prefilling:
            return
        self._prompt_took(now)
        if self._ending.nothing_to_generate:  # evaluate the prompt into the cache only
            self.finish(StopCause.LIMIT)
            return
        at = index + n_tokens - 1
        self._begin(self._sample(at), at)

    def _prompt_took(self, now: float) -> None:
        self._prompt_done = now
        self.slot.prompt_took(now - self._started)

    # ---- the tokens --------------------------------------------------------------------------

    def _begin(self, token: int, at: int) -> None:
        """Take *token* (sampled from the logits at *at*): it ends the generation or is evaluated next."""
        cause = self._take(token, at)
        if cause is not None:
            self.finish(cause, undecoded=token)
            return
        self._token = token

    def _after_draft(self, index: int) -> None:
        draft, cache = self._draft, self.cache
        base = len(cache.tokens) - len(draft)  # the cache up to the token before the draft
        walk = self._verifier.walk(draft, index, self._sample, self._take_drafted)
        self.slot.draft_verified(len(draft), walk.kept)
        cache.truncate(base + walk.kept)
        if walk.token is not None:
            self._begin(walk.token, walk.at)
        elif self._walk_ended is not None:
            self.finish(self._walk_ended)
        else:
            self._begin(self._next(walk.at), walk.at)

    def _take_drafted(self, token: int, at: int) -> bool:
        """Take an accepted draft token; whether the walk goes on."""
        cause = self._take(token, at)
        if cause is not None:
            self._walk_ended = cause
            return False
        return not self._insert

    def _next(self, index: int) -> int:
        """The next token: an inserted one if the grammar admits it, else one sampled at *index*."""
        sampler = self._sampler
        assert sampler is not None
        if self._insert:
            if sampler.allows(self._insert[0]):
                inserted = self._insert.pop(0)
                sampler.accept(inserted)
                return inserted
            self._insert.clear()  # the grammar forbids the end marker here: give up the budget
        return self._sample(index)

    def _sample(self, index: int) -> int:
        sampler = self._sampler
        assert sampler is not None
        return self._probabilities.sample(sampler, index)

    def _next_draft(self) -> tuple[int, ...]:
        """Tokens worth verifying after the current one, within the limits, the context and the batch.

        A draft shorter than the request's ``speculative.n_min`` is not verified.
        """
        if self._drafts is None or self._insert:
            return ()
        context, limits = self._context, self.request.speculative
        room = min(context.n_ctx_seq - len(self.cache.tokens) - 2, context.n_batch - 1, limits.n_max)
        left = self._ending.tokens_left
        draft = self._drafts.propose(room if left is None else min(room, left))
        return draft if len(draft) >= limits.n_min else ()

    def _take(self, token: int, at: int) -> StopCause | None:
        """Account for one generated token, emit it, and say whether it ends the generation."""
        self.slot.generated()
        verdict = self._ending.take(token, self._pieces[token])
        cause = verdict.cause
        logprob = self._probabilities.of(token, at) if cause is not StopCause.EOS else None
        self._emit(TokenGenerated(token_id=token, text=verdict.text, logprob=logprob))
        if cause is None:
            if self._drafts is not None:
                self._drafts.observe(token)
            self._insert.extend(verdict.insert)
        return cause
