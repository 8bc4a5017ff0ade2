"""One request on the decode thread: its prompt in chunks, then sample, stop, insert, verify drafts.

The decode loop (:mod:`._decode_loop`) asks every active sequence for its part
of the next batch (a chunk of prompt while prefilling, the last sampled token
while generating), evaluates all parts in one ``llama_decode``, then hands each
sequence the batch index of its part, where its logits are.

While a sequence is alone in the batch it may add a draft to its token: tokens
that followed the last n-gram earlier in the context, as many as the
:class:`DraftPolicy` finds worth verifying.  Then it samples at each draft
position in turn: a sampled token equal to the draft's is accepted and the
next position is tried; the first one that differs is kept as the next token
and the rest of the draft is dropped from the cache.  Every emitted token is
therefore sampled from the model's own distribution, exactly as without
drafting; the draft only decides how many positions one step evaluates.  With
other sequences in the batch a draft would slow them down, so none is made.

A generation that reaches the end of its context stops there (``CONTEXT``),
unless the engine shifts the context (llama-server's ``--context-shift``):
then, before the token that would not fit is evaluated, the first ``n_keep``
tokens stay, half of the rest are dropped and the later cells move down
(:meth:`SequenceCache.shift`), and the generation goes on.  Without a token
limit it then ends at the model's training context, as in llama-server.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import attrs
import numpy as np

from bubo.domain.generation import (
    CacheReport,
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStats,
    PromptProgress,
    StopCause,
    ThinkingBudget,
    TokenGenerated,
    TokenLogprob,
    TopLogprob,
)

from ._context import BatchEntry, LlamaContext
from ._draft_policy import DraftPolicy, ProposalTracker
from ._kv import SequenceCache
from ._lookup import PromptLookup
from ._sampler import Sampler
from ._stops import GeneratedText
from .base import EngineFailure
from .slots import Slot

__all__ = ["Outcome", "Sequence"]


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


class Sequence:
    """The state of one request's generation in its slot's KV sequence (decode thread only)."""

    def __init__(
        self,
        context: LlamaContext,
        slot: Slot,
        request: GenerationRequest,
        *,
        pieces: list[bytes],
        eog: frozenset[int],
        drafting: DraftPolicy | None,
        emit: Callable[[EngineEvent], None],
        context_shift: bool = False,
    ) -> None:
        self.request = request
        self.slot = slot
        self.cache: SequenceCache = context.caches[slot.id]
        self.cancelled = False  # set on the trio thread; the loop drops the sequence at its next step
        self.outcome: Outcome | None = None
        self._context = context
        self._pieces = pieces
        self._eog = frozenset() if request.ignore_eos else eog
        self._emit = emit
        self._policy = drafting
        self._sampler: Sampler | None = None
        self._text = GeneratedText(request.stop)
        self._limit = request.max_new_tokens
        self._time_limit_ms = request.time_limit_ms
        self._thinking = _ThinkingClock(request.thinking_budget)
        self._lookup: PromptLookup | None = None
        self._proposal: ProposalTracker | None = None
        self._forced: list[int] = []  # tokens inserted instead of sampled (the end of thinking)
        self._prompt_at = 0  # the next prompt token to evaluate
        self._token: int | None = None  # sampled and emitted, not yet evaluated
        self._draft: tuple[int, ...] = ()
        self._n = 0
        self._drafted = 0
        self._accepted = 0
        self._n_cached = 0
        self._cache_report = CacheReport()
        self._started = self._prompt_done = self._first_token_at = 0.0
        self._timed_out = 0  # tokens generated since the time limit passed (finishing a character)
        self._context_shift = context_shift and self.cache.can_shift()
        self._shifts = 0
        self._discarded = 0  # tokens the shifts dropped from the sequence
        self._indent = _IndentLimit(request.n_indent)
        # the last sample's token, its probability and the top, post chain
        self._candidates: tuple[int, float, list[tuple[int, float]]] | None = None

    # ---- what the loop asks ------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the generation ended (its outcome is set)."""
        return self.outcome is not None

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to evaluate."""
        return self._prompt_at < len(self.request.prompt_tokens)

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
        self._sampler = Sampler(
            request.sampling,
            n_vocab=context.n_vocab,
            n_ctx=context.n_ctx_seq,
            vocab=context.vocab,
            grammar=request.grammar,
            dry=context.dry,
        )
        self._sampler.remember(prompt)
        if self._policy is not None:
            options = self._policy.options
            self._lookup = PromptLookup(
                prompt, draft_max=options.draft_max, ngram_min=options.ngram_min, ngram_max=options.ngram_max
            )
        self._n_cached, self._cache_report = self.cache.prepare(
            prompt, request.cache_tags, reuse=request.cache_prompt
        )
        self._prompt_at = self._n_cached
        self.slot.reused(self._n_cached)
        self.slot.holds(len(self.cache.tokens))
        # llama-server's first progress report, before any prompt token is decoded
        self._emit(
            PromptProgress(
                total=len(prompt), cached=self._n_cached, processed=0, elapsed_ms=0.0, slot_id=self.slot.id
            )
        )

    def prompt_entry(self, room: int) -> BatchEntry:
        """Up to *room* prompt tokens for the next batch (logits after the prompt's last)."""
        prompt = self.request.prompt_tokens
        chunk = prompt[self._prompt_at : self._prompt_at + room]
        return BatchEntry(self.cache, chunk, last_logits=self._prompt_at + len(chunk) == len(prompt))

    def token_entry(self, *, alone: bool) -> BatchEntry:
        """The token to evaluate next, with a draft after it when the sequence is *alone* in the batch."""
        assert self._token is not None
        if self._context_shift and len(self.cache.tokens) + 1 >= self._context.n_ctx_seq:
            self._shift()
        self._draft = tuple(self._next_draft()) if alone else ()
        return BatchEntry(self.cache, (self._token, *self._draft), all_logits=bool(self._draft))

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*: take the next token, or account for the prompt."""
        self.slot.holds(len(self.cache.tokens))
        if self._token is None:  # no token yet: the entry was a prompt chunk
            self._after_prompt_chunk(len(entry.tokens), index)
        else:
            self._after_token(index)

    def finish(self, cause: StopCause, *, undecoded: int | None = None) -> None:
        """End the generation: emit its last event and free the sampler."""
        now = time.perf_counter()
        if not self._prompt_done:  # ended before its prompt was evaluated (the context filled up)
            self._prompt_took(now)
        predicted_ms = (now - self._prompt_done) * 1000.0
        self.slot.generation_took(predicted_ms / 1000.0)
        self.close()
        self.outcome = Outcome(
            n_generated=self._n,
            cause=cause,
            stop_word=self._text.matched,
            drafted=self._drafted,
            accepted=self._accepted,
            undecoded=undecoded,
            shifted=self._shifts > 0,
        )
        self._emit(
            GenerationFinished(
                cause=cause,
                stop_word=self._text.matched,
                stats=GenerationStats(
                    prompt_tokens=len(self.request.prompt_tokens),
                    cached_tokens=self._n_cached,
                    prompt_ms=(self._prompt_done - self._started) * 1000.0,
                    completion_tokens=self._n,
                    predicted_ms=predicted_ms,
                    draft_tokens=self._drafted,
                    draft_accepted=self._accepted,
                    cache=self._cache_report,
                    slot_id=self.slot.id,
                    context_shifts=self._shifts,
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
        prompt = self.request.prompt_tokens
        self._prompt_at += n_tokens
        self.slot.evaluated(n_tokens)
        now = time.perf_counter()
        self._emit(
            PromptProgress(
                total=len(prompt),
                cached=self._n_cached,
                processed=self._prompt_at - self._n_cached,
                elapsed_ms=(now - self._started) * 1000.0,
                slot_id=self.slot.id,
            )
        )
        if self.prefilling:
            return
        self._prompt_took(now)
        if self._limit is not None and self._limit <= 0:  # evaluate the prompt into the cache only
            self.finish(StopCause.LIMIT)
            return
        assert self._sampler is not None
        self._begin(self._sample(index + n_tokens - 1), index + n_tokens - 1)

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

    def _after_token(self, index: int) -> None:
        draft = self._draft
        if not draft:
            self._begin(self._next(index), index)
            return
        sampler, cache = self._sampler, self.cache
        assert sampler is not None
        base = len(cache.tokens) - 1 - len(draft)  # the cache before this step
        self._drafted += len(draft)
        self.slot.drafted(len(draft))
        for position, proposed in enumerate(draft):
            sampled = self._sample(index + position)
            if sampled != proposed:
                cache.truncate(base + 1 + position)
                self._begin(sampled, index + position)
                return
            self._accepted += 1
            self.slot.draft_accepted()
            cause = self._take(sampled, index + position)
            if cause is not None or self._forced:
                cache.truncate(base + 2 + position)
                if cause is not None:
                    self.finish(cause)
                else:
                    self._begin(self._next(index + 1 + position), index + 1 + position)
                return
        at = index + len(draft)
        self._begin(self._sample(at), at)

    def _next(self, index: int) -> int:
        """The next token: an inserted one if the grammar admits it, else one sampled at *index*."""
        sampler = self._sampler
        assert sampler is not None
        if self._forced:
            if sampler.allows(self._forced[0]):
                inserted = self._forced.pop(0)
                sampler.accept(inserted)
                return inserted
            self._forced.clear()  # the grammar forbids the end marker here: give up the budget
        return self._sample(index)

    def _sample(self, index: int) -> int:
        """A token sampled from the logits at *index*; with post-sampling probabilities, they are kept."""
        sampler = self._sampler
        assert sampler is not None
        if not self.request.post_sampling_probs or self.request.n_probs is None:
            return sampler.sample(self._context.ctx, index)
        self._candidates = sampler.sample_candidates(
            self._context.ctx, index, self._context.n_vocab, self.request.n_probs
        )
        return self._candidates[0]

    def _next_draft(self) -> list[int]:
        """Tokens worth verifying after the current one, within the limit and the context."""
        if self._lookup is None or self._policy is None or self._forced:
            return []
        if self._proposal is None:
            tokens, ngram = self._lookup.propose()
            if not tokens:
                return []
            self._proposal = ProposalTracker(tokens, ngram)
        room = self._context.n_ctx_seq - len(self.cache.tokens) - 2
        if self._limit is not None:
            room = min(room, self._limit - self._n)
        room = min(room, self._context.n_batch - 1)
        remaining = self._proposal.remaining[: max(room, 0)]
        return remaining[: self._policy.draft_length(self._proposal.ngram, len(remaining))]

    def _take(self, token: int, at: int) -> StopCause | None:
        """Account for one generated token, emit it, and say whether to stop."""
        self._n += 1
        self.slot.generated()
        text = self._text
        logprob = None
        if token in self._eog:
            cause: StopCause | None = StopCause.EOS
            released = self._indent.feed(text.finish())[0]
        else:
            if self.request.n_probs is not None:
                candidates, self._candidates = self._candidates, None
                logprob = (
                    self._post_sampling(token, candidates[1], candidates[2])
                    if candidates is not None and candidates[0] == token  # not an inserted token
                    else self._logprob(token, at, self.request.n_probs)
                )
            released, cut = self._indent.feed(text.feed(self._pieces[token]))
            cause = StopCause.LIMIT if cut else self._exhausted()
            if cause is not None and text.matched is None and not cut:
                released += self._indent.feed(text.finish())[0]
        if text.matched is not None:
            cause = StopCause.STOP_WORD
        self._emit(TokenGenerated(token_id=token, text=released, logprob=logprob))
        if cause is None:
            if self._lookup is not None:
                self._lookup.append(token)
            proposal, policy = self._proposal, self._policy
            if proposal is not None and policy is not None and proposal.observe(token, policy):
                self._proposal = None
            self._forced.extend(self._thinking.observe(text.recent))
        return cause

    def _exhausted(self) -> StopCause | None:
        """The limit, the context, or the time limit (after a new line, as in llama-server).

        The token and time limits wait for the tokens that finish a character
        the last token began (at most three); the end of the context cannot.
        """
        if self._n == 1:
            self._first_token_at = time.perf_counter()
        limit = self._limit
        if limit is not None and self._n >= limit and self._text.may_end(self._n - limit):
            return StopCause.LIMIT
        position = len(self.request.prompt_tokens) + self._n - self._discarded  # where it is evaluated
        if position >= self._context.n_ctx_seq and not self._context_shift:  # no room to evaluate it
            return StopCause.CONTEXT
        if limit is None and len(self.request.prompt_tokens) + self._n >= self._context.n_ctx_train:
            return StopCause.CONTEXT  # shifting without a limit: stop at the training context

        elapsed_ms = (time.perf_counter() - self._first_token_at) * 1000.0
        if self._time_limit_ms and self._text.saw_new_line and elapsed_ms > self._time_limit_ms:
            self._timed_out += 1
            if self._text.may_end(self._timed_out - 1):
                return StopCause.TIME
        return None

    def _shift(self) -> None:
        """Make room for the next token: keep ``n_keep`` tokens (after a BOS), drop half of the rest."""
        prompt = self.request.prompt_tokens
        n_keep = len(prompt) if self.request.n_keep < 0 else self.request.n_keep
        if self._context.bos is not None and prompt[0] == self._context.bos:
            n_keep += 1
        n_keep = min(self._context.n_ctx_seq - 4, n_keep)
        n_discard = (len(self.cache.tokens) - n_keep) // 2
        self.cache.shift(n_keep, n_discard)
        self._discarded += n_discard
        self._shifts += 1
        self.slot.holds(len(self.cache.tokens))

    def _post_sampling(self, token: int, chosen: float, candidates: list[tuple[int, float]]) -> TokenLogprob:
        """Log-probabilities after the sampler chain (llama-server's ``post_sampling_probs``)."""
        top = tuple(TopLogprob(token_id=t, piece=self._pieces[t], logprob=math.log(p)) for t, p in candidates)
        return TokenLogprob(
            token_id=token,
            piece=self._pieces[token],
            logprob=math.log(chosen) if chosen > 0 else -math.inf,
            top=top,
        )

    def _logprob(self, token: int, at: int, n_top: int) -> TokenLogprob:
        """Log-probabilities from the raw logits (llama-server's pre-sampling probs)."""
        logits = self._context.logits(at)
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        top: tuple[TopLogprob, ...] = ()
        if n_top > 0:
            n_top = min(n_top, len(logits))
            candidates = np.argpartition(logits, -n_top)[-n_top:]
            ordered = candidates[np.argsort(logits[candidates])[::-1]]
            top = tuple(
                TopLogprob(token_id=int(t), piece=self._pieces[int(t)], logprob=float(logits[t]) - log_total)
                for t in ordered
            )
        return TokenLogprob(
            token_id=token, piece=self._pieces[token], logprob=float(logits[token]) - log_total, top=top
        )


class _IndentLimit:
    """llama-server's ``n_indent``: a line after a new line must be indented by at least that many blanks.

    Fed the released text; returns it cut before the first character of a line
    indented less, and whether it was cut (the generation ends there).
    """

    def __init__(self, n_indent: int) -> None:
        self._n_indent = n_indent
        self._line: int | None = (
            None  # blanks so far on the current line, after a new line; None: not checked
        )

    def feed(self, text: str) -> tuple[str, bool]:
        if self._n_indent <= 0:
            return text, False
        for at, char in enumerate(text):
            if char == "\n":
                self._line = 0
            elif self._line is None:
                continue
            elif char in " \t":
                self._line += 1
            elif self._line < self._n_indent:
                return text[:at], True
            else:
                self._line = None
        return text, False


class _ThinkingClock:
    """Counts thinking tokens and says when to insert the end of thinking (``ThinkingBudget``)."""

    def __init__(self, spec: ThinkingBudget | None) -> None:
        self._spec = spec
        self._thinking = spec is not None and spec.started
        self._over = spec is None
        self._count = 0

    def observe(self, recent: str) -> tuple[int, ...]:
        """After each generated token: the tokens to insert now, if the budget is spent."""
        if self._over:
            return ()
        assert self._spec is not None
        if not self._thinking:
            self._thinking = self._spec.start_text in recent
            return ()
        if self._spec.end_text in recent:
            self._over = True
            return ()
        self._count += 1
        if self._count < self._spec.budget:
            return ()
        self._over = True
        return self._spec.end_tokens
