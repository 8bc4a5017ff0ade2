"""Drafts for one generation: where they come from, and how a verified draft is walked.

While a generation is alone in the batch it may add a draft to its token:
tokens a :class:`DraftSource` proposes (:class:`LookupDrafts`: those that
followed the last n-gram earlier in the context, as many as the
:class:`DraftPolicy` finds worth verifying).  After the decode the
:class:`DraftVerifier` samples at each draft position in turn: a sampled token
equal to the draft's is accepted and the next position is tried; the first one
that differs is kept as the next token and the rest of the draft is dropped.
Every emitted token is therefore sampled from the model's own distribution,
exactly as without drafting; the draft only decides how many positions one
step evaluates.  With other generations in the batch a draft would slow them
down, so none is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from ._draft_policy import DraftPolicy, ProposalTracker
from ._lookup import PromptLookup

__all__ = ["DraftSource", "DraftVerifier", "LookupDrafts", "Walk"]


class DraftSource(Protocol):
    """Proposes the tokens likely to follow, and hears which tokens did."""

    def propose(self, room: int) -> tuple[int, ...]:
        """At most *room* tokens worth verifying after the current one (``()``: none)."""
        ...

    def observe(self, token: int) -> None:
        """*token* was generated (or inserted) and the generation goes on."""
        ...


class LookupDrafts:
    """Prompt-lookup drafts: what followed the last n-gram in the context, as long as the policy pays for."""

    def __init__(self, prompt: Sequence[int], policy: DraftPolicy) -> None:
        options = policy.options
        self._lookup = PromptLookup(
            prompt, draft_max=options.draft_max, ngram_min=options.ngram_min, ngram_max=options.ngram_max
        )
        self._policy = policy
        self._proposal: ProposalTracker | None = None

    def propose(self, room: int) -> tuple[int, ...]:
        """See :meth:`DraftSource.propose`; a proposal is followed token by token until it ends."""
        if self._proposal is None:
            tokens, ngram = self._lookup.propose()
            if not tokens:
                return ()
            self._proposal = ProposalTracker(tokens, ngram)
        remaining = self._proposal.remaining[: max(room, 0)]
        return tuple(remaining[: self._policy.draft_length(self._proposal.ngram, len(remaining))])

    def observe(self, token: int) -> None:
        """See :meth:`DraftSource.observe`: the policy learns from every proposal, drafted or not."""
        self._lookup.append(token)
        proposal = self._proposal
        if proposal is not None and proposal.observe(token, self._policy):
            self._proposal = None


class Walk(NamedTuple):
    """Where walking a draft stopped.

    ``kept``: draft tokens the sequence keeps after the token before them.
    ``token``: the next token, sampled at batch index ``at`` (None: the walk
    was stopped by an accepted token; the generation continues from ``at``).
    """

    kept: int
    token: int | None
    at: int


class DraftVerifier:
    """Walks verified drafts and counts what they gave."""

    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0

    def walk(
        self,
        draft: Sequence[int],
        index: int,
        sample: Callable[[int], int],
        take: Callable[[int, int], bool],
    ) -> Walk:
        """Sample at each position of *draft* (decoded from batch index *index*) until one differs.

        *sample(at)* samples at batch index *at*; *take(token, at)* takes an
        accepted token and says whether the walk goes on (not once the token
        ended the generation, or something must be inserted next).
        """
        self.drafted += len(draft)
        for position, proposed in enumerate(draft):
            sampled = sample(index + position)
            if sampled != proposed:
                return Walk(kept=position, token=sampled, at=index + position)
            self.accepted += 1
            if not take(sampled, index + position):
                return Walk(kept=position + 1, token=None, at=index + position + 1)
        at = index + len(draft)
        return Walk(kept=len(draft), token=sample(at), at=at)
