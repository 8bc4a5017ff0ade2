"""How many drafted tokens to verify: drafted only where it is measured to pay.

Verifying a draft is not free.  On a CPU, evaluating ``1 + k`` tokens in one
batch costs nearly ``1 + k`` single steps' worth of compute for a small model
(measured on the 2-core reference machine: 1 token 10.3 ms, 5 tokens 33.6 ms,
17 tokens 90.5 ms), so a draft that is mostly rejected makes decoding slower;
on a GPU the same batch costs about one step and drafting nearly always pays.

The policy therefore keeps two estimates and drafts ``k`` tokens only when
the expected tokens per step beat the expected cost:

- the per-token acceptance rate ``p`` of proposals, per n-gram size, learnt
  from *every* proposal, drafted or not: a proposal that was not drafted is
  still compared with the tokens the model then generated, which is exactly
  what verification would have accepted (sampling is the same either way);
- the marginal cost ``beta`` of one more token in a batch, relative to a
  single-token step, learnt from the decodes themselves.

With a geometric model of acceptance, ``k`` drafted tokens yield
``1 + p + … + p^k`` tokens for a cost of ``1 + beta·k`` steps; the policy
drafts the ``k`` that maximises that ratio when it beats 1 by a margin.

``beta`` is learnt only from batches, so a policy that stopped drafting
(after batches that ran slow for a while, or were timed against single steps
at a shorter context) would never learn that drafting pays again.  After
``EXPLORE_AFTER_STEPS`` single steps it therefore verifies one short draft of
a proposal that is more likely right than wrong: at most one small batch per
64 tokens, a bounded cost, which keeps ``beta`` current.

A draft model (``--model-draft``) costs more than a lookup: each drafted token
is one decode of the draft model, ``gamma`` single target steps (learnt from
the draft decodes, starting from the models' size ratio).  ``k`` model-drafted
tokens therefore cost ``1 + (beta + gamma)·k`` steps, and their acceptance
``p`` is learnt from the drafts verified (a draft model's proposal exists only
when it is run, so exploration drafts one regardless of ``p``).  On the 2-core
reference machine a 135M model drafting for itself (``gamma`` about 1) never
pays; a draft model a tenth of its target's size with ``beta`` near 0 (a GPU,
or a target large enough that a step is bound by reading its weights) does.

``mode="always"`` drafts whatever is proposed, as llama-server does (for
tests and for machines where drafting is known to pay).
"""

from __future__ import annotations

import attrs

from bubo.domain.modes import DraftMode

__all__ = ["MODEL_DRAFTS", "DraftMode", "DraftOptions", "DraftPolicy", "ProposalTracker"]

# Weight kept by older observations at each new one (about the last 20 proposals count).
DECAY = 0.95
# The draft must promise this much speed-up over not drafting.
MARGIN = 1.05
# Before any batch was timed: a CPU-like cost of one more token in a batch.
PRIOR_BETA = 0.5
# Single steps after which a likely proposal is drafted anyway, to measure beta again; its length.
EXPLORE_AFTER_STEPS = 64
EXPLORE_TOKENS = 4
# The acceptance statistics of a draft model's proposals are kept under this n-gram size.
MODEL_DRAFTS = 0


@attrs.frozen(kw_only=True)
class DraftOptions:
    """Drafting: prompt lookup, or a draft model's when the engine has one; ``draft_max`` 0 turns it off.

    ``mode``: ``measured`` drafts where the policy finds it pays; ``always`` whatever is proposed.
    """

    draft_max: int = 0
    ngram_min: int = 2
    ngram_max: int = 8
    mode: DraftMode = "measured"


@attrs.define
class _Acceptance:
    """Decayed counts of accepted and rejected proposal tokens (Beta(1, 1) prior)."""

    accepted: float = 0.0
    rejected: float = 0.0

    @property
    def rate(self) -> float:
        return (self.accepted + 1.0) / (self.accepted + self.rejected + 2.0)

    def observe(self, accepted: int, *, rejected: bool) -> None:
        self.accepted = self.accepted * DECAY + accepted
        self.rejected = self.rejected * DECAY + rejected


class DraftPolicy:
    """The engine's drafting statistics, shared by its generations (one thread at a time)."""

    def __init__(self, options: DraftOptions, *, draft_cost_prior: float = 1.0) -> None:
        """*draft_cost_prior*: a draft model's step in target steps before one is timed (the size ratio)."""
        self.options = options
        self._acceptance: dict[int, _Acceptance] = {}
        self._single_step_s: float | None = None
        self._draft_step_s: float | None = None
        self._draft_cost_prior = draft_cost_prior
        self._beta = PRIOR_BETA
        self._steps_since_batch = 0

    def acceptance(self, ngram: int) -> float:
        """The estimated chance that the next proposed token of an *ngram*-sized match is accepted."""
        stats = self._acceptance.get(ngram)
        return stats.rate if stats is not None else 0.5

    @property
    def beta(self) -> float:
        """The estimated cost of one more token in a batch, in single-token steps."""
        return self._beta

    @property
    def draft_cost(self) -> float:
        """The estimated cost of one draft-model decode, in single target steps (``gamma``)."""
        if self._draft_step_s is None or not self._single_step_s:
            return self._draft_cost_prior
        return self._draft_step_s / self._single_step_s

    def draft_length(self, ngram: int, available: int) -> int:
        """How many of *available* proposed lookup tokens to verify now (0: decode one token alone)."""
        limit = min(available, self.options.draft_max)
        if self.options.mode == "always":
            return limit
        p = self.acceptance(ngram)
        best = _best_length(p, self._beta, limit)
        if best == 0 and self._steps_since_batch >= EXPLORE_AFTER_STEPS and p > 0.5:
            return min(limit, EXPLORE_TOKENS)
        return best

    def model_draft_length(self, available: int) -> int:
        """The most tokens a draft model should draft now, of *available* room (0: do not run it)."""
        limit = min(available, self.options.draft_max)
        if self.options.mode == "always":
            return limit
        best = _best_length(self.acceptance(MODEL_DRAFTS), self._beta + self.draft_cost, limit)
        if best == 0 and self._steps_since_batch >= EXPLORE_AFTER_STEPS:
            return min(limit, EXPLORE_TOKENS)
        return best

    def observe_proposal(self, ngram: int, accepted: int, *, rejected: bool) -> None:
        """A proposal ended: *accepted* of its tokens matched, then one did not (*rejected*) or it ran out."""
        self._acceptance.setdefault(ngram, _Acceptance()).observe(accepted, rejected=rejected)

    def observe_draft_decode(self, seconds: float) -> None:
        """A draft model's one-token decode took *seconds*."""
        previous = self._draft_step_s
        self._draft_step_s = seconds if previous is None else previous * DECAY + seconds * (1 - DECAY)

    def observe_decode(self, n_tokens: int, seconds: float) -> None:
        """A ``llama_decode`` of *n_tokens* during generation took *seconds*."""
        if n_tokens == 1:
            previous = self._single_step_s
            self._single_step_s = seconds if previous is None else previous * DECAY + seconds * (1 - DECAY)
            self._steps_since_batch += 1
            return
        self._steps_since_batch = 0
        if self._single_step_s:
            observed = max(0.0, (seconds / self._single_step_s - 1.0) / (n_tokens - 1))
            self._beta = self._beta * DECAY + observed * (1 - DECAY)


def _best_length(p: float, cost_per_token: float, limit: int) -> int:
    """The ``k <= limit`` maximising ``(1 + p + … + p^k) / (1 + cost·k)``, if it beats the margin (else 0)."""
    best_k, best_gain = 0, MARGIN
    expected, term = 1.0, 1.0
    for k in range(1, limit + 1):
        term *= p
        expected += term
        gain = expected / (1.0 + cost_per_token * k)
        if gain > best_gain:
            best_k, best_gain = k, gain
    return best_k


class ProposalTracker:
    """Follows one proposal against the tokens actually generated, drafted or not."""

    def __init__(self, tokens: list[int], ngram: int) -> None:
        self.tokens = tokens
        self.ngram = ngram
        self.matched = 0

    @property
    def remaining(self) -> list[int]:
        """The proposed tokens not yet generated."""
        return self.tokens[self.matched :]

    def observe(self, token: int, policy: DraftPolicy) -> bool:
        """Compare the next generated *token*; report to *policy* and return True when the proposal ended."""
        if token == self.tokens[self.matched]:
            self.matched += 1
            if self.matched < len(self.tokens):
                return False
            policy.observe_proposal(self.ngram, self.matched, rejected=False)
            return True
        policy.observe_proposal(self.ngram, self.matched, rejected=True)
        return True
