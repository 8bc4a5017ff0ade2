"""The log-probabilities a request asked for (``n_probs``), for each generated token.

By default they are llama-server's pre-sampling probabilities: the softmax of
the raw logits at the token's position, with the ``n_probs`` most likely
alternatives.  With ``post_sampling_probs`` they are those after every stage
of the sampler chain (the distribution the token was drawn from): the sampler
then draws through :meth:`TokenSampler.sample_candidates`, and the recorder
keeps what it returned for the token taken next.  A token inserted instead of
sampled (the end of thinking) gets the raw ones.
"""

from __future__ import annotations

import math

import numpy as np

from bubo.domain.generation import GenerationRequest, TokenLogprob, TopLogprob

from ._protocols import DecodeContext, TokenSampler

__all__ = ["ProbabilityRecorder"]


class ProbabilityRecorder:
    """Samples for one generation and says what each taken token's log-probabilities were."""

    def __init__(self, request: GenerationRequest, context: DecodeContext, pieces: list[bytes]) -> None:
        self._n_top = request.n_probs
        self._post_sampling = request.post_sampling_probs and request.n_probs is not None
        self._context = context
        self._pieces = pieces
        # the last draw's token, its probability and the top, after the chain (post-sampling only)
        self._candidates: tuple[int, float, list[tuple[int, float]]] | None = None

    def sample(self, sampler: TokenSampler, index: int) -> int:
        """A token sampled from the logits at batch index *index* (keeping the chain's probabilities)."""
        context = self._context
        if not self._post_sampling:
            return sampler.sample(context.ctx, index)
        assert self._n_top is not None
        self._candidates = sampler.sample_candidates(context.ctx, index, context.n_vocab, self._n_top)
        return self._candidates[0]

    def of(self, token: int, at: int) -> TokenLogprob | None:
        """*token*'s log-probabilities, taken from the logits at *at* (None: the request asked for none)."""
        if self._n_top is None:
            return None
        candidates, self._candidates = self._candidates, None
        if candidates is not None and candidates[0] == token:  # drawn, not inserted
            return self._after_the_chain(token, candidates[1], candidates[2])
        return self._from_logits(token, at, self._n_top)

    def _after_the_chain(
        self, token: int, chosen: float, candidates: list[tuple[int, float]]
    ) -> TokenLogprob:
        """Log-probabilities after the sampler chain (llama-server's ``post_sampling_probs``)."""
        pieces = self._pieces
        top = tuple(TopLogprob(token_id=t, piece=pieces[t], logprob=math.log(p)) for t, p in candidates)
        return TokenLogprob(
            token_id=token,
            piece=pieces[token],
            logprob=math.log(chosen) if chosen > 0 else -math.inf,
            top=top,
        )

    def _from_logits(self, token: int, at: int, n_top: int) -> TokenLogprob:
        """Log-probabilities from the raw logits (llama-server's pre-sampling probs)."""
        pieces = self._pieces
        logits = self._context.logits(at)
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        top: tuple[TopLogprob, ...] = ()
        if n_top > 0:
            n_top = min(n_top, len(logits))
            candidates = np.argpartition(logits, -n_top)[-n_top:]
            ordered = candidates[np.argsort(logits[candidates])[::-1]]
            top = tuple(
                TopLogprob(token_id=int(t), piece=pieces[int(t)], logprob=float(logits[t]) - log_total)
                for t in ordered
            )
        return TokenLogprob(
            token_id=token, piece=pieces[token], logprob=float(logits[token]) - log_total, top=top
        )
