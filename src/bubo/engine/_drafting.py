"""One generation's speculative decoding: where its drafts come from, the draft in the batch, its walk.

The source is chosen when the generation starts: the draft model's
(:class:`~._model_drafts.ModelDrafts`, through the engine's :class:`Drafter`)
when the engine has one, else prompt lookup's (:class:`LookupDrafts`), and
none for a request whose ``speculative.n_max`` is 0 or that holds an image
(drafts know nothing of an image's positions).  A draft is proposed only
while the generation is alone in the batch, within the request's
``speculative`` limits, the sequence's room and the batch; the
:class:`DraftVerifier` then walks it, and the sequence keeps what was accepted.

Decode thread only; written against :mod:`._protocols`.
"""

from __future__ import annotations

from collections.abc import Callable

from bubo.domain.generation import GenerationRequest

from ._draft_policy import DraftPolicy
from ._draft_verifier import DraftSource, DraftVerifier, LookupDrafts, Walk
from ._model_drafts import Drafter
from ._protocols import DecodeContext, KvSequence
from .slots import Slot

__all__ = ["Drafting"]


class Drafting:
    """A generation's drafts: their source (None: no drafting), the draft in the batch, what they gave."""

    def __init__(
        self,
        request: GenerationRequest,
        slot: Slot,
        context: DecodeContext,
        *,
        policy: DraftPolicy | None,
        drafter: Drafter | None,
    ) -> None:
        """*policy*: the engine's drafting statistics; *drafter*: its draft model (None: prompt lookup)."""
        self._request = request
        self._slot = slot
        self._context = context
        self._cache: KvSequence = context.caches[slot.id]
        self._policy = policy
        self._drafter = drafter
        self.verifier = DraftVerifier()
        self.source: DraftSource | None = None
        self.draft: tuple[int, ...] = ()  # the draft in the batch, after the generation's token

    def start(self) -> None:
        """Choose the source: the draft model's drafts if the engine has one, else prompt lookup's."""
        request = self._request
        if request.speculative.n_max <= 0 or request.images:  # drafts know nothing of an image's positions
            return
        if self._drafter is not None:
            self.source = self._drafter.drafts(
                self._slot.id, request.prompt_tokens, p_min=request.speculative.p_min
            )
        elif self._policy is not None:
            self.source = LookupDrafts(request.prompt_tokens, self._policy)

    def observe(self, token: int) -> None:
        """*token* was generated (or inserted) and the generation goes on."""
        if self.source is not None:
            self.source.observe(token)

    def propose(self, *, allowed: bool, tokens_left: int | None) -> tuple[int, ...]:
        """The next draft: tokens worth verifying after the current one (none unless *allowed*).

        Within the request's limits, the sequence's room, the batch and the
        *tokens_left* to generate; a draft shorter than the request's
        ``speculative.n_min`` is not verified.
        """
        self.draft = ()
        if allowed and self.source is not None:
            context, limits = self._context, self._request.speculative
            room = min(context.n_ctx_seq - len(self._cache.tokens) - 2, context.n_batch - 1, limits.n_max)
            draft = self.source.propose(room if tokens_left is None else min(room, tokens_left))
            self.draft = draft if len(draft) >= limits.n_min else ()
        return self.draft

    def verify(self, index: int, sample: Callable[[int], int], take: Callable[[int, int], bool]) -> Walk:
        """Walk the draft decoded from batch index *index* (:meth:`DraftVerifier.walk`); keep the accepted."""
        draft, cache = self.draft, self._cache
        base = len(cache.tokens) - len(draft)  # the cache up to the token before the draft
        walk = self.verifier.walk(draft, index, sample, take)
        self._slot.draft_verified(len(draft), walk.kept)
        cache.truncate(base + walk.kept)
        return walk
