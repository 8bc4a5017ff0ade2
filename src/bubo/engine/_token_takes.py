"""What follows each generated token: its take, at once or beside the next decode, and what it asks to insert.

A token's take counts it for the slot, asks the :class:`EndPolicy` for its
verdict (the text it releases, the end it causes, the tokens to insert next),
notes its log-probabilities and tells the draft source, and emits its event.

With ``defer`` a token whose verdict can wait (:meth:`EndPolicy.can_wait`:
only a stop string could end the generation with it) is evaluated next before
it is taken: :meth:`TokenTakes.wait` notes its log-probabilities (the next
decode overwrites the logits) and tells the draft source at once (the next
proposal needs it), and :meth:`TokenTakes.settle` does the rest later, on
whichever thread runs it while the decode thread is in ``llama_decode``: it
touches the slot's counters, the end policy and the event, never the KV
sequence.  The tokens and their text are those of an immediate take.

The tokens a verdict asks to insert (the end of thinking) replace sampling
while the grammar admits them; one it forbids gives the insertion up.  A token
that could ask for one never waits, so an insertion is never late.
"""

from __future__ import annotations

from collections.abc import Callable

from bubo.domain.generation import EngineEvent, StopCause, TokenGenerated, TokenLogprob

from ._drafting import Drafting
from ._end_policy import EndPolicy, Verdict
from ._probabilities import ProbabilityRecorder
from ._protocols import TokenSampler
from .slots import Slot

__all__ = ["TokenTakes"]


class TokenTakes:
    """One generation's takes of its tokens, and the tokens its verdicts ask to insert next."""

    def __init__(
        self,
        *,
        slot: Slot,
        ending: EndPolicy,
        probabilities: ProbabilityRecorder,
        drafting: Drafting,
        pieces: list[bytes],
        emit: Callable[[EngineEvent], None],
        defer: bool,
    ) -> None:
        """*defer*: a token whose verdict can wait is taken later (:meth:`wait`, :meth:`settle`)."""
        self._slot = slot
        self._ending = ending
        self._probabilities = probabilities
        self._drafting = drafting
        self._pieces = pieces
        self._emit = emit
        self._defer = defer
        self._waiting: tuple[int, TokenLogprob | None] | None = None  # sampled, its take deferred
        self._insert: list[int] = []  # tokens inserted instead of sampled (the end of thinking)
        self.walk_ended: StopCause | None = None  # what a take during a draft's walk ended it with

    @property
    def waiting(self) -> bool:
        """Whether a token was sampled and its take waits (:meth:`settle`, before the next sampling)."""
        return self._waiting is not None

    @property
    def inserting(self) -> bool:
        """Whether tokens wait to be inserted instead of sampled."""
        return bool(self._insert)

    @property
    def tokens_left(self) -> int | None:
        """Tokens the limit still allows, the waiting one counted (None: no limit)."""
        left = self._ending.tokens_left
        return left - 1 if left is not None and self._waiting is not None else left

    def now(self, token: int, at: int) -> StopCause | None:
        """Take *token* (sampled from the logits at *at*) at once; the end it causes."""
        verdict = self._account(token)
        cause = verdict.cause
        logprob = self._probabilities.of(token, at) if cause is not StopCause.EOS else None
        self._emit(TokenGenerated(token_id=token, text=verdict.text, logprob=logprob))
        if cause is None:
            self._drafting.observe(token)
            self._insert.extend(verdict.insert)
        return cause

    def drafted(self, token: int, at: int) -> bool:
        """Take an accepted draft token at once; whether the walk goes on (:attr:`walk_ended` if not)."""
        cause = self.now(token, at)
        if cause is not None:
            self.walk_ended = cause
            return False
        return not self._insert

    def wait(self, token: int, at: int) -> bool:
        """Keep *token*'s take for :meth:`settle`, if its verdict can wait; whether it does."""
        if not (self._defer and self._ending.can_wait(token)):
            return False
        self._waiting = (token, self._probabilities.of(token, at))
        self._drafting.observe(token)
        return True

    def settle(self) -> StopCause | None:
        """Take the waiting token; the end it causes (only a stop string can end it here)."""
        assert self._waiting is not None
        token, logprob = self._waiting
        self._waiting = None
        verdict = self._account(token)
        self._emit(TokenGenerated(token_id=token, text=verdict.text, logprob=logprob))
        return verdict.cause

    def drop(self) -> None:
        """The generation was let go of: a waiting token counts as generated, as an immediate take's."""
        if self._waiting is not None:
            self._waiting = None
            self._slot.generated()

    def inserted(self, sampler: TokenSampler) -> int | None:
        """The next token to insert, if the grammar admits it (shown to *sampler*); else None."""
        if not self._insert:
            return None
        if not sampler.allows(self._insert[0]):
            self._insert.clear()  # the grammar forbids the end marker here: give up the budget
            return None
        inserted = self._insert.pop(0)
        sampler.accept(inserted)
        return inserted

    def _account(self, token: int) -> Verdict:
        self._slot.generated()
        return self._ending.take(token, self._pieces[token])
