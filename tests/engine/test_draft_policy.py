"""When prompt-lookup drafts are worth verifying: learnt acceptance against measured batch cost."""

from __future__ import annotations

import pytest

from bubo.engine._draft_policy import MODEL_DRAFTS, DraftOptions, DraftPolicy, ProposalTracker


def policy(draft_max: int = 16) -> DraftPolicy:
    return DraftPolicy(DraftOptions(draft_max=draft_max))


def teach(policy: DraftPolicy, ngram: int, *, accepted: int, rejected: bool, times: int) -> None:
    for _ in range(times):
        policy.observe_proposal(ngram, accepted, rejected=rejected)


class TestDraftLength:
    def test_nothing_is_drafted_before_anything_is_known(self) -> None:
        """An even chance of acceptance does not pay for a CPU batch."""
        assert policy().draft_length(ngram=4, available=16) == 0

    def test_proposals_that_keep_failing_are_not_drafted(self) -> None:
        p = policy()
        teach(p, 2, accepted=0, rejected=True, times=20)
        assert p.acceptance(2) < 0.1
        assert p.draft_length(ngram=2, available=16) == 0

    def test_proposals_that_keep_matching_are_drafted_long(self) -> None:
        p = policy()
        teach(p, 8, accepted=16, rejected=False, times=20)
        assert p.acceptance(8) > 0.95
        assert p.draft_length(ngram=8, available=16) >= 8

    def test_each_ngram_size_has_its_own_estimate(self) -> None:
        p = policy()
        teach(p, 8, accepted=16, rejected=False, times=20)
        teach(p, 2, accepted=0, rejected=True, times=20)
        assert p.draft_length(ngram=8, available=16) > 0
        assert p.draft_length(ngram=2, available=16) == 0

    def test_never_more_than_available_or_draft_max(self) -> None:
        p = policy(draft_max=4)
        teach(p, 8, accepted=16, rejected=False, times=20)
        assert p.draft_length(ngram=8, available=3) <= 3
        assert p.draft_length(ngram=8, available=16) <= 4

    def test_cheap_batches_draft_longer(self) -> None:
        """Where a batch costs about one step (a GPU), a moderate acceptance already pays."""
        cpu, gpu = policy(), policy()
        for p in (cpu, gpu):
            teach(p, 4, accepted=3, rejected=True, times=20)  # three of four accepted
        for _ in range(200):
            cpu.observe_decode(1, 0.010)
            cpu.observe_decode(9, 0.050)  # each extra token half a step
            gpu.observe_decode(1, 0.010)
            gpu.observe_decode(9, 0.0104)  # nearly free
        assert cpu.beta == pytest.approx(0.5, abs=0.05)
        assert gpu.beta < 0.05
        assert gpu.draft_length(ngram=4, available=16) > cpu.draft_length(ngram=4, available=16)

    def test_a_policy_that_stopped_drafting_measures_again(self) -> None:
        """Batches that once ran slow must not stop drafting for good: beta is only learnt from batches."""
        p = policy()
        teach(p, 8, accepted=16, rejected=False, times=20)
        for _ in range(100):
            p.observe_decode(1, 0.010)
            p.observe_decode(5, 0.100)  # a slow spell: each extra token costs two steps
        assert p.draft_length(ngram=8, available=16) == 0
        for _ in range(63):
            p.observe_decode(1, 0.010)
        assert p.draft_length(ngram=8, available=16) == 0
        p.observe_decode(1, 0.010)
        assert p.draft_length(ngram=8, available=16) == 4  # one short exploratory draft
        for _ in range(60):  # batches are cheap again: each exploratory batch teaches it
            p.observe_decode(5, 0.014)
        assert p.draft_length(ngram=8, available=16) >= 8

    def test_unlikely_proposals_are_not_explored(self) -> None:
        p = policy()
        teach(p, 2, accepted=0, rejected=True, times=20)
        for _ in range(200):
            p.observe_decode(1, 0.010)
        assert p.draft_length(ngram=2, available=16) == 0


class TestProposalTracker:
    def test_a_proposal_is_scored_against_what_was_generated(self) -> None:
        """Undrafted proposals teach the policy too: the model's own tokens are the verdict."""
        p = policy()
        tracker = ProposalTracker([5, 6, 7], ngram=3)
        assert tracker.observe(5, p) is False
        assert tracker.remaining == [6, 7]
        assert tracker.observe(9, p) is True  # 6 was proposed, 9 came: one accepted, then rejected
        assert p.acceptance(3) == pytest.approx((1 + 1) / (1 + 1 + 2))

    def test_a_fully_matched_proposal_ends_without_a_rejection(self) -> None:
        p = policy()
        tracker = ProposalTracker([5, 6], ngram=2)
        assert tracker.observe(5, p) is False
        assert tracker.observe(6, p) is True
        assert p.acceptance(2) == pytest.approx((2 + 1) / (2 + 2))


class TestDraftModelLength:
    """A draft model's drafts cost one of its decodes per token: they must pay for that too."""

    @staticmethod
    def accepted_always(p: DraftPolicy) -> None:
        teach(p, MODEL_DRAFTS, accepted=8, rejected=False, times=30)

    def test_a_draft_model_as_large_as_the_model_never_pays_on_a_cpu(self) -> None:
        p = DraftPolicy(DraftOptions(draft_max=16), draft_cost_prior=1.0)
        self.accepted_always(p)
        assert p.model_draft_length(available=16) == 0

    def test_a_small_draft_model_pays_where_batches_are_cheap(self) -> None:
        p = DraftPolicy(DraftOptions(draft_max=16), draft_cost_prior=0.1)
        self.accepted_always(p)
        for _ in range(200):
            p.observe_decode(1, 0.010)
            p.observe_decode(9, 0.011)  # a GPU-like batch
        assert p.model_draft_length(available=16) >= 8

    def test_the_draft_cost_is_learnt_from_its_decodes(self) -> None:
        p = DraftPolicy(DraftOptions(draft_max=16), draft_cost_prior=0.1)
        p.observe_decode(1, 0.010)
        for _ in range(100):
            p.observe_draft_decode(0.010)  # it turns out as slow as the model
        assert p.draft_cost == pytest.approx(1.0)
        self.accepted_always(p)
        assert p.model_draft_length(available=16) == 0

    def test_a_policy_that_does_not_run_the_draft_model_tries_it_again(self) -> None:
        """Its acceptance is learnt only from its drafts: after 64 plain steps one short draft is made."""
        p = DraftPolicy(DraftOptions(draft_max=16), draft_cost_prior=1.0)
        for _ in range(63):
            p.observe_decode(1, 0.010)
        assert p.model_draft_length(available=16) == 0
        p.observe_decode(1, 0.010)
        assert p.model_draft_length(available=16) == 4

    def test_always_drafts_what_there_is_room_for(self) -> None:
        p = DraftPolicy(DraftOptions(draft_max=16, mode="always"), draft_cost_prior=1.0)
        assert p.model_draft_length(available=5) == 5
        assert p.model_draft_length(available=40) == 16
        assert p.draft_length(ngram=2, available=40) == 16
