"""One generation's token loop: sample, stop, insert, and verify prompt-lookup drafts.

After each token the loop may propose a draft (tokens that followed the last
n-gram earlier in the context); the :class:`DraftPolicy` says how many of them
are worth verifying.  The loop evaluates the token and the draft in one batch,
then sample at each draft position in turn: a sampled token equal to the
draft's is accepted and the next position is tried; the first one that
differs is kept as the next token and the rest of the draft is dropped from
the cache.  Every emitted token is therefore sampled from the model's own
distribution, exactly as without drafting; the draft only decides how many
positions one ``llama_decode`` call evaluates.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import numpy as np
import trio

from bubo.domain.generation import (
    EngineEvent,
    GenerationRequest,
    StopCause,
    ThinkingBudget,
    TokenGenerated,
    TokenLogprob,
    TopLogprob,
)

from ._context import LlamaContext
from ._draft_policy import DraftPolicy, ProposalTracker
from ._lookup import PromptLookup
from ._sampler import Sampler
from ._stops import GeneratedText
from .base import EngineCounters

__all__ = ["Generation"]


@attrs.frozen(kw_only=True)
class Outcome:
    """How a generation ended and what drafting did."""

    n_generated: int
    cause: StopCause
    stop_word: str | None = None
    drafted: int = 0
    accepted: int = 0
    undecoded: int | None = None  # the last generated token, when it is not in the KV cache


class Generation:
    """The token loop of one request, on the engine thread."""

    def __init__(
        self,
        context: LlamaContext,
        request: GenerationRequest,
        *,
        pieces: list[bytes],
        eog: frozenset[int],
        counters: EngineCounters,
        drafting: DraftPolicy | None,
        emit: Callable[[EngineEvent], None],
    ) -> None:
        self._context = context
        self._request = request
        self._pieces = pieces
        self._eog = frozenset() if request.ignore_eos else eog
        self._counters = counters
        self._text = GeneratedText(request.stop)
        self._emit = emit
        self._sampler = Sampler(
            request.sampling,
            n_vocab=context.n_vocab,
            n_ctx=context.n_ctx,
            vocab=context.vocab,
            grammar=request.grammar,
        )
        self._sampler.remember(request.prompt_tokens)
        self._limit = request.max_new_tokens
        self._time_limit_ms = request.time_limit_ms
        self._thinking = _ThinkingClock(request.thinking_budget, context.tokenize)
        self._policy = drafting
        self._lookup = (
            PromptLookup(
                request.prompt_tokens,
                draft_max=drafting.options.draft_max,
                ngram_min=drafting.options.ngram_min,
                ngram_max=drafting.options.ngram_max,
            )
            if drafting is not None
            else None
        )
        self._proposal: ProposalTracker | None = None
        self._forced: list[int] = []  # tokens inserted instead of sampled (the end of thinking)
        self._n = 0
        self._drafted = 0
        self._accepted = 0
        self._first_token_at = 0.0
        self._timed_out = 0  # tokens generated since the time limit passed (finishing a character)

    def run(self) -> Outcome:
        """Generate until a stop; the sampler is freed whatever happens."""
        try:
            return self._run()
        finally:
            self._sampler.close()

    def _run(self) -> Outcome:
        if self._limit is not None and self._limit <= 0:  # evaluate the prompt into the cache only
            return self._outcome(StopCause.LIMIT)
        token, at = self._sampler.sample(self._context.ctx, -1), -1
        while True:
            cause = self._take(token, at)
            if cause is not None:
                return self._outcome(cause, undecoded=token)
            trio.from_thread.check_cancelled()
            draft = self._draft()
            if not draft:
                self._decode((token,))
                token, at = self._next(), -1
                continue
            outcome = self._verify(token, draft)
            if isinstance(outcome, Outcome):
                return outcome
            token, at = outcome

    def _next(self) -> int:
        """The next token: an inserted one if the grammar admits it, else a sampled one."""
        if self._forced:
            if self._sampler.allows(self._forced[0]):
                inserted = self._forced.pop(0)
                self._sampler.accept(inserted)
                return inserted
            self._forced.clear()  # the grammar forbids the end marker here: give up the budget
        return self._sampler.sample(self._context.ctx, -1)

    def _decode(self, tokens: tuple[int, ...]) -> None:
        """Evaluate *tokens* (logits for every one when there is a draft), timing it for the policy."""
        started = time.perf_counter()
        if len(tokens) == 1:
            self._context.decode(tokens)
        else:
            self._context.decode_all(tokens)
        if self._policy is not None:
            self._policy.observe_decode(len(tokens), time.perf_counter() - started)

    def _draft(self) -> list[int]:
        """Tokens worth verifying after the current one, within the limit and the context."""
        if self._lookup is None or self._policy is None or self._forced:
            return []
        if self._proposal is None:
            tokens, ngram = self._lookup.propose()
            if not tokens:
                return []
            self._proposal = ProposalTracker(tokens, ngram)
        room = self._context.n_ctx - len(self._context.cache.tokens) - 2
        if self._limit is not None:
            room = min(room, self._limit - self._n)
        remaining = self._proposal.remaining[: max(room, 0)]
        return remaining[: self._policy.draft_length(self._proposal.ngram, len(remaining))]

    def _verify(self, token: int, draft: list[int]) -> tuple[int, int] | Outcome:
        """Evaluate *token* and *draft* at once; accept the draft's prefix the model agrees with."""
        context = self._context
        base = len(context.cache.tokens)
        self._decode((token, *draft))
        self._drafted += len(draft)
        self._counters.draft_tokens += len(draft)
        self._counters.draft_steps += 1
        for position, proposed in enumerate(draft):
            sampled: int = self._sampler.sample(context.ctx, position)
            if sampled != proposed:
                context.truncate(base + 1 + position)
                return sampled, position
            self._accepted += 1
            self._counters.draft_accepted += 1
            cause = self._take(sampled, position)
            if cause is not None or self._forced:
                context.truncate(base + 2 + position)
                if cause is not None:
                    return self._outcome(cause)
                return self._next(), -1
        return self._sampler.sample(context.ctx, len(draft)), len(draft)

    def _take(self, token: int, at: int) -> StopCause | None:
        """Account for one generated token, emit it, and say whether to stop."""
        self._n += 1
        self._counters.task_decoded = self._n
        text = self._text
        logprob = None
        if token in self._eog:
            cause: StopCause | None = StopCause.EOS
            released = text.finish()
        else:
            if self._request.n_probs is not None:
                logprob = self._logprob(token, at, self._request.n_probs)
            released = text.feed(self._pieces[token])
            cause = self._exhausted()
            if cause is not None and text.matched is None:
                released += text.finish()
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
        if len(self._request.prompt_tokens) + self._n >= self._context.n_ctx:  # no room to evaluate it
            return StopCause.CONTEXT
        elapsed_ms = (time.perf_counter() - self._first_token_at) * 1000.0
        if self._time_limit_ms and self._text.saw_new_line and elapsed_ms > self._time_limit_ms:
            self._timed_out += 1
            if self._text.may_end(self._timed_out - 1):
                return StopCause.TIME
        return None

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

    def _outcome(self, cause: StopCause, *, undecoded: int | None = None) -> Outcome:
        return Outcome(
            n_generated=self._n,
            cause=cause,
            stop_word=self._text.matched,
            drafted=self._drafted,
            accepted=self._accepted,
            undecoded=undecoded,
        )


class _ThinkingClock:
    """Counts thinking tokens and says when to insert the end of thinking (``ThinkingBudget``)."""

    def __init__(self, spec: ThinkingBudget | None, tokenize: Callable[[str], tuple[int, ...]]) -> None:
        self._spec = spec
        self._tokenize = tokenize
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
        return self._tokenize("\n" + self._spec.end_text + "\n\n")
