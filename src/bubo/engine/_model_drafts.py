"""Drafts from a draft model: what a smaller model says follows, greedily, while it is sure.

The :class:`Drafter` holds the draft model's context (one KV sequence per
slot, :mod:`._draft_model`), shared by the engine's generations; each
generation drafts through a :class:`ModelDrafts`, the :class:`DraftSource` of
:mod:`._draft_verifier`.  To draft, the slot's draft sequence is first brought
in step with the generation's tokens (prompt and generated): it keeps its
longest common prefix with them (from an earlier request, or the tokens of the
last draft that were accepted) and evaluates the rest.  Then the draft model
proposes its most likely token, evaluates it and proposes the next, up to the
length the :class:`DraftPolicy` allows, and stops at the first token it gives
less than the request's ``p_min``.  The main model then verifies the draft in
one batch, as it verifies a prompt-lookup draft.

Drafting is an optimisation: a draft decode that fails costs the drafts only.
The failure is logged once and the engine generates without a draft model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from ._draft_policy import MODEL_DRAFTS, DraftPolicy, ProposalTracker
from ._protocols import BatchEntry, ContextFull, DecodeContext, KvSequence
from .errors import EngineFailure
from .slots import common_prefix

__all__ = ["Drafter", "ModelDrafts"]

logger = logging.getLogger(__name__)


class Drafter:
    """A draft model's context and the engine's drafting policy (decode thread only)."""

    def __init__(self, context: DecodeContext, policy: DraftPolicy) -> None:
        self.context = context
        self.policy = policy
        self.failed = False

    def drafts(self, slot_id: int, prompt: Sequence[int], *, p_min: float) -> ModelDrafts:
        """A generation's draft source in slot *slot_id*, starting from *prompt*."""
        return ModelDrafts(self, self.context.caches[slot_id], prompt, p_min=p_min)

    def fail(self, failure: EngineFailure) -> None:
        """A draft decode failed: draft no more (the generations go on without drafts)."""
        if not self.failed:
            logger.error("the draft model failed; generating without it from now on: %s", failure.message)
        self.failed = True

    def make_room(self, keep: KvSequence) -> None:
        """The draft context is full: forget every other slot's draft sequence (re-read when needed)."""
        for cache in self.context.caches:
            if cache is not keep:
                cache.clear()


class ModelDrafts:
    """One generation's drafts from the draft model, and the tokens it has seen."""

    def __init__(self, drafter: Drafter, cache: KvSequence, prompt: Sequence[int], *, p_min: float) -> None:
        self._drafter = drafter
        self._cache = cache
        self._history = list(prompt)  # the generation's tokens: prompt, then each generated one
        self._p_min = p_min
        self._proposal: ProposalTracker | None = None

    def propose(self, room: int) -> tuple[int, ...]:
        """See :meth:`DraftSource.propose`: the rest of a draft still being followed, else a new one."""
        if self._proposal is not None:
            return tuple(self._proposal.remaining[: max(room, 0)])
        drafter = self._drafter
        if drafter.failed:
            return ()
        room = min(room, drafter.context.n_ctx_seq - len(self._history) - 1)
        length = drafter.policy.model_draft_length(room) if room > 0 else 0
        if length <= 0:
            return ()
        try:
            draft = self._draft(length)
        except ContextFull:
            self._cache.clear()
            return ()
        except EngineFailure as failure:
            self._cache.clear()
            drafter.fail(failure)
            return ()
        if draft:
            self._proposal = ProposalTracker(list(draft), MODEL_DRAFTS)
        return draft

    def observe(self, token: int) -> None:
        """See :meth:`DraftSource.observe`: the policy learns how much of each draft was right."""
        self._history.append(token)
        proposal = self._proposal
        if proposal is not None and proposal.observe(token, self._drafter.policy):
            self._proposal = None

    def _draft(self, length: int) -> tuple[int, ...]:
        """Up to *length* tokens, each the draft model's most likely, while at least ``p_min`` likely."""
        context, policy = self._drafter.context, self._drafter.policy
        index = self._catch_up()
        draft: list[int] = []
        while True:
            logits = context.logits(index)
            token = int(np.argmax(logits))
            shifted = np.exp(logits - logits[token])
            if 1.0 / float(shifted.sum()) < self._p_min:
                break
            draft.append(token)
            if len(draft) >= length:
                break
            started = time.perf_counter()
            self._decode((token,))
            policy.observe_draft_decode(time.perf_counter() - started)
            index = 0
        return tuple(draft)

    def _catch_up(self) -> int:
        """Make the draft sequence hold the generation's tokens; the batch index of the last one's logits."""
        cache, history, n_batch = self._cache, self._history, self._drafter.context.n_batch
        keep = cache.truncate(min(common_prefix(cache.tokens, history), len(history) - 1))
        rest, last = history[keep:], 0
        for start in range(0, len(rest), n_batch):
            chunk = tuple(rest[start : start + n_batch])
            self._decode(chunk)
            last = len(chunk) - 1
        return last

    def _decode(self, tokens: tuple[int, ...]) -> None:
        """Evaluate *tokens* in the draft sequence (logits for the last); once more after making room."""
        entry = BatchEntry(self._cache, tokens)
        try:
            self._drafter.context.decode_batch([entry])
        except ContextFull:
            self._drafter.make_room(self._cache)
            self._drafter.context.decode_batch([entry])
