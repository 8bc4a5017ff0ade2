"""How many prompt tokens a decode step carries, and how the prompts being read share them.

With no stream decoding, a prompt is read in the largest batches the context
takes: nobody waits on the step.  Beside decoding streams every step still
carries each stream's next token, so the step's length is the streams'
inter-token gap; the prompt's part is then sized from the measured cost of a
step (a fixed part and a part per token, fitted to recent steps with
exponential forgetting) so that the step stays under the target gap
(``--prefill-gap-ms``).  Where the streams' own part of a step (the fixed cost
and their tokens) is already most of that target, a slow or loaded machine, the
gap gives way instead of the prompt: the prompt's part is at least nine times
the streams' part, so reading it beside streams takes at most about 10 % longer
than alone (without that floor it would fall to a few tokens a step, and the
newcomer's first token to many times its lone read; measured under load).
A fixed ``--prefill-chunk N`` takes N tokens a step whoever else runs.

Several prompts read at once share the step's room: each gets at least an
even share of half of it, and the rest goes oldest first, so the oldest
finishes soonest and none waits for all the others to end.

Pure arithmetic on the decode thread's own measurements: tested alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["DEFAULT_GAP_S", "PROMPT_OVER_STREAMS", "PrefillBudget", "share_room"]

DEFAULT_GAP_S = 0.5  # the streams' inter-token gap a prompt read beside them may stretch to
MIN_CHUNK = 16  # prompt tokens a step carries beside streams, however slow steps are: the prompt advances
PROMPT_OVER_STREAMS = 9.0  # the prompt's part of a step is at least this many times the streams' part
FIRST_CHUNK = 64  # beside streams, before any step was measured
FORGETTING = 0.9  # weight of a step's measurement after each later one
_MIN_SPREAD = 1e-9


class PrefillBudget:
    """The prompt tokens each step may carry (decode thread only)."""

    def __init__(self, *, fixed: int | None, n_batch: int, target_gap_s: float = DEFAULT_GAP_S) -> None:
        """*fixed*: tokens a step, whatever runs (``--prefill-chunk N``); None sizes them (``auto``)."""
        self._fixed = None if fixed is None else max(1, min(fixed, n_batch))
        self._n_batch = n_batch
        self._target = target_gap_s
        # weighted sums over recent steps of (tokens n, seconds t): w, w·n, w·n², w·t, w·n·t
        self._w = self._n = self._nn = self._t = self._nt = 0.0
        self._largest = 0  # the most tokens a measured step carried (the fit is not trusted far beyond)

    def room(self, n_decoding: int) -> int:
        """Prompt tokens the next step may carry beside *n_decoding* streams' tokens."""
        space = self._n_batch - n_decoding
        if self._fixed is not None:
            return min(self._fixed, space)
        if n_decoding == 0:
            return space
        cost = self.step_cost()
        if cost is None:
            chunk = FIRST_CHUNK
        else:
            fixed, per_token = cost
            within_target = int((self._target - fixed) / per_token) - n_decoding
            streams_part = fixed / per_token + n_decoding  # in prompt tokens' worth of time
            chunk = max(within_target, math.ceil(PROMPT_OVER_STREAMS * streams_part))
            chunk = min(chunk, 2 * max(self._largest, FIRST_CHUNK) - n_decoding)  # the fit is local
        return max(min(chunk, space), min(MIN_CHUNK, space))

    def observe(self, n_tokens: int, seconds: float) -> None:
        """A step of *n_tokens* tokens took *seconds*."""
        keep = FORGETTING
        self._w = self._w * keep + 1.0
        self._n = self._n * keep + n_tokens
        self._nn = self._nn * keep + n_tokens * n_tokens
        self._t = self._t * keep + seconds
        self._nt = self._nt * keep + n_tokens * seconds
        self._largest = max(self._largest, n_tokens)

    def step_cost(self) -> tuple[float, float] | None:
        """``(fixed seconds, seconds per token)`` of a step as measured so far; None before any."""
        if self._w == 0.0 or self._n == 0.0:
            return None
        spread = self._w * self._nn - self._n * self._n
        if spread > _MIN_SPREAD * self._w * self._nn:
            per_token = (self._w * self._nt - self._n * self._t) / spread
            if per_token > 0.0:
                return max(0.0, (self._t - per_token * self._n) / self._w), per_token
        if self._t <= 0.0:  # a clock too coarse to see the steps: nothing measured yet
            return None
        return 0.0, self._t / self._n  # steps of one size (or noise): all cost per token, the safe side


def share_room(needs: Sequence[int], room: int) -> list[int]:
    """Split *room* among prompts needing *needs* (oldest first): a floor each, the rest oldest first."""
    if not needs:
        return []
    floor = room // (2 * len(needs))
    shares = [min(need, floor) for need in needs]
    left = room - sum(shares)
    for i, need in enumerate(needs):
        more = min(need - shares[i], left)
        shares[i] += more
        left -= more
    return shares
