"""The prompt tokens a step carries: the whole batch alone, a measured share beside streams, fairly split."""

from __future__ import annotations

import pytest

from bubo.engine._prefill_budget import FIRST_CHUNK, MIN_CHUNK, PROMPT_OVER_STREAMS, PrefillBudget, share_room


def measured(fixed_s: float, per_token_s: float, sizes: list[int], target_s: float = 0.5) -> PrefillBudget:
    budget = PrefillBudget(fixed=None, n_batch=2048, target_gap_s=target_s)
    for n in sizes:
        budget.observe(n, fixed_s + per_token_s * n)
    return budget


class TestAuto:
    def test_alone_a_prompt_takes_the_whole_batch(self) -> None:
        assert PrefillBudget(fixed=None, n_batch=2048).room(0) == 2048

    def test_beside_streams_before_any_measurement_a_first_chunk(self) -> None:
        assert PrefillBudget(fixed=None, n_batch=2048).room(3) == FIRST_CHUNK

    def test_the_step_cost_is_fitted_from_steps_of_several_sizes(self) -> None:
        budget = measured(0.02, 0.004, [3, 64, 3, 128, 3, 256])
        fixed, per_token = budget.step_cost()  # type: ignore[misc]
        assert fixed == pytest.approx(0.02)
        assert per_token == pytest.approx(0.004)

    def test_the_chunk_keeps_the_step_under_the_target_gap(self) -> None:
        budget = measured(0.02, 0.004, [3, 64, 3, 128, 3, 256, 3, 256])
        chunk = budget.room(3)
        assert 0.02 + 0.004 * (chunk + 3) <= 0.5 + 1e-9
        assert 0.02 + 0.004 * (chunk + 5) > 0.5  # and is about the largest that does

    def test_the_chunk_grows_at_most_twice_past_what_was_measured(self) -> None:
        budget = measured(0.001, 0.0001, [3, 4, 3, 4])  # a fast machine: the fit alone would allow thousands
        assert budget.room(3) == 2 * FIRST_CHUNK - 3

    def test_where_the_streams_alone_fill_the_target_the_prompt_still_gets_nine_tenths(self) -> None:
        """A loaded machine: the streams' step is most of the target, so the gap gives way, not the prompt."""
        fixed, per_token = 0.4, 0.01
        budget = measured(fixed, per_token, [3, 64, 3, 128, 3, 256, 3, 256])
        chunk = budget.room(3)
        streams = fixed + per_token * 3
        assert chunk == pytest.approx(PROMPT_OVER_STREAMS * streams / per_token, abs=1)

    def test_one_cheap_stream_still_leaves_a_minimum(self) -> None:
        budget = measured(0.0, 0.05, [1, 1, 1])
        assert budget.room(1) == MIN_CHUNK

    def test_a_clock_that_saw_no_time_leaves_the_first_chunk(self) -> None:
        """A coarse clock (every step 0 s) is no measurement: no division by a zero cost."""
        budget = measured(0.0, 0.0, [3, 3, 3])
        assert budget.step_cost() is None
        assert budget.room(3) == FIRST_CHUNK

    def test_steps_of_one_size_are_read_as_all_per_token_cost(self) -> None:
        budget = measured(0.0, 0.01, [64, 64, 64])
        assert budget.step_cost() == pytest.approx((0.0, 0.01))


class TestFixed:
    def test_a_fixed_chunk_is_taken_whoever_runs(self) -> None:
        budget = PrefillBudget(fixed=256, n_batch=2048)
        assert (budget.room(0), budget.room(3)) == (256, 256)

    def test_never_past_the_batch(self) -> None:
        assert PrefillBudget(fixed=4096, n_batch=2048).room(2) == 2046


class TestSharing:
    def test_one_prompt_takes_all_it_needs(self) -> None:
        assert share_room([1000], 256) == [256]
        assert share_room([100], 256) == [100]

    def test_the_oldest_gets_most_and_none_starves(self) -> None:
        shares = share_room([1000, 1000, 1000], 240)
        assert shares == [160, 40, 40]

    def test_room_a_prompt_does_not_need_goes_to_the_next(self) -> None:
        assert share_room([10, 1000], 256) == [10, 246]
