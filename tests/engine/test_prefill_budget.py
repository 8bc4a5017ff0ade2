"""The prompt tokens a step carries: the whole batch alone, a measured share beside streams, fairly split."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bubo.engine._prefill_budget import (
    DEFAULT_MIN_CHUNK,
    PROMPT_OVER_STREAMS,
    PrefillBudget,
    StepCost,
    _root,
    attended_cells,
    share_room,
)

FEW = 16  # a floor low enough that the sizing above it shows


def measured(
    fixed_s: float, per_token_s: float, sizes: list[int], target_s: float = 0.5, min_chunk: int = FEW
) -> PrefillBudget:
    budget = PrefillBudget(fixed=None, n_batch=2048, target_gap_s=target_s, min_chunk=min_chunk)
    for n in sizes:
        budget.observe(n, fixed_s + per_token_s * n)
    return budget


class TestAuto:
    def test_alone_a_prompt_takes_the_whole_batch(self) -> None:
        assert PrefillBudget(fixed=None, n_batch=2048).room(0) == 2048

    def test_beside_streams_before_any_measurement_the_floor(self) -> None:
        assert PrefillBudget(fixed=None, n_batch=2048).room(3) == DEFAULT_MIN_CHUNK

    def test_the_step_cost_is_fitted_from_steps_of_several_sizes(self) -> None:
        budget = measured(0.02, 0.004, [3, 64, 3, 128, 3, 256])
        assert budget.step_cost() == StepCost(pytest.approx(0.02), pytest.approx(0.004))

    def test_the_chunk_keeps_the_step_under_the_target_gap(self) -> None:
        budget = measured(0.02, 0.004, [3, 64, 3, 128, 3, 256, 3, 256])
        chunk = budget.room(3)
        assert 0.02 + 0.004 * (chunk + 3) <= 0.5 + 1e-9
        assert 0.02 + 0.004 * (chunk + 5) > 0.5  # and is about the largest that does

    def test_the_chunk_grows_at_most_twice_past_what_was_measured(self) -> None:
        budget = measured(0.001, 0.0001, [3, 40, 3, 40])  # fast: the fit alone would allow thousands
        assert budget.room(3) == 2 * 40 - 3
        budget.observe(2048, 0.0)  # a step the clock did not see measured nothing, its size included
        assert budget.room(3) == 2 * 40 - 3

    def test_where_the_streams_alone_fill_the_target_the_prompt_still_gets_most_of_the_step(self) -> None:
        """A loaded machine: the streams' step is most of the target, so the gap gives way, not the prompt."""
        fixed, per_token = 0.4, 0.01
        budget = measured(fixed, per_token, [3, 64, 3, 128, 3, 256, 3, 512])
        chunk = budget.room(3)
        streams = fixed + per_token * 3
        assert chunk == pytest.approx(PROMPT_OVER_STREAMS * streams / per_token, abs=1)

    def test_never_fewer_than_the_floor_however_slow_the_steps(self) -> None:
        """Smaller batches read each token slower: a step carries at least min_chunk prompt tokens."""
        budget = measured(0.0, 0.05, [3, 64, 3, 128], min_chunk=256)  # 256 tokens: 12.8 s, past the target
        assert budget.room(3) == 256
        assert measured(0.0, 0.05, [1, 1, 1]).room(1) == FEW

    def test_the_floor_is_within_the_batch(self) -> None:
        assert PrefillBudget(fixed=None, n_batch=128, min_chunk=256).room(3) == 125

    def test_a_clock_that_saw_no_time_leaves_the_floor(self) -> None:
        """A coarse clock (every step 0 s) is no measurement: no division by a zero cost."""
        budget = measured(0.0, 0.0, [3, 3, 3])
        assert budget.step_cost() is None
        assert budget.room(3) == FEW

    def test_steps_of_one_size_are_read_as_all_per_token_cost(self) -> None:
        budget = measured(0.0, 0.01, [64, 64, 64])
        assert budget.step_cost() == StepCost(0.0, pytest.approx(0.01))

    def test_a_short_step_weighs_as_much_as_a_long_one(self) -> None:
        """Fitted by relative error: the streams' short steps decide the fixed part, not the lone reads'."""
        budget = PrefillBudget(fixed=None, n_batch=2048)
        for n, seconds in [(2048, 12.0), (3, 0.045), (3, 0.045), (3, 0.045), (64, 0.35), (2048, 12.4)]:
            budget.observe(n, seconds)
        cost = budget.step_cost()
        assert cost is not None
        assert cost.fixed < 0.045


class TestLaterTokensCostMore:
    """Each token attends over the cells before it: a prompt's late tokens cost more than its early ones."""

    FIXED, PER_TOKEN, PER_CELL = 0.05, 0.004, 2e-6  # about a 0.5B model on two cores

    def cost(self, tokens: int, cells: int) -> float:
        return self.FIXED + self.PER_TOKEN * tokens + self.PER_CELL * cells

    def read_beside_streams(self, budget: PrefillBudget, prompt: int, streams_at: int = 100) -> list[float]:
        """Steps' seconds while a *prompt*-token prompt is read beside three streams, as the loop steps."""
        steps, at = [], 0
        while at < prompt:
            streams_cells = 3 * attended_cells(streams_at, 1)
            chunk = min(budget.room(3, streams_cells=streams_cells, prompt_at=at), prompt - at)
            cells = streams_cells + attended_cells(at, chunk)
            seconds = self.cost(3 + chunk, cells)
            budget.observe(3 + chunk, seconds, cells=cells)
            steps.append(seconds)
            at += chunk
            streams_at += 1
        return steps

    def test_the_three_parts_are_fitted(self) -> None:
        budget = PrefillBudget(fixed=None, n_batch=2048)
        steps = [(3, 100), (64, 0), (3, 101), (128, 64), (3, 102), (256, 192), (2048, 0), (407, 2048)]
        for tokens, at in steps:
            cells = attended_cells(at, tokens)
            budget.observe(tokens, self.cost(tokens, cells), cells=cells)
        assert budget.step_cost() == StepCost(
            pytest.approx(self.FIXED), pytest.approx(self.PER_TOKEN), pytest.approx(self.PER_CELL)
        )

    def test_the_steps_stay_under_the_target_to_the_end_of_a_long_prompt(self) -> None:
        """Fitted as a fixed part and a part per token only, the steps grew to several times the target."""
        budget = PrefillBudget(fixed=None, n_batch=2048, target_gap_s=1.0, min_chunk=FEW)
        for _ in range(8):  # the streams before the newcomer
            budget.observe(3, self.cost(3, 300), cells=300)
        steps = self.read_beside_streams(budget, prompt=2400)
        assert max(steps) <= 1.0 * 1.01
        assert min(steps[4:-1]) > 0.98  # the target is used once the chunk grew (it at most doubles a step)

    def test_later_in_the_prompt_a_step_takes_fewer_tokens(self) -> None:
        budget = PrefillBudget(fixed=None, n_batch=2048, target_gap_s=1.0, min_chunk=FEW)
        self.read_beside_streams(budget, prompt=600)
        early, late = (budget.room(3, streams_cells=300, prompt_at=at) for at in (0, 2000))
        assert late < early

    def test_where_the_streams_fill_the_target_the_floor_holds_along_the_prompt(self) -> None:
        """A loaded machine: every step's prompt part is at least PROMPT_OVER_STREAMS times the streams' part."""
        budget = PrefillBudget(fixed=None, n_batch=2048, target_gap_s=0.1, min_chunk=FEW)
        steps = self.read_beside_streams(budget, prompt=2400)
        streams = self.cost(3, 300)
        grown = steps[4:-1]  # once the chunk has grown from the floor (it at most doubles a step)
        assert all(step >= (1 + PROMPT_OVER_STREAMS) * streams * 0.999 for step in grown)


steps_seen = st.lists(
    st.tuples(
        st.integers(1, 2048),  # tokens
        st.floats(0.0, 60.0, allow_nan=False),  # seconds (0: a clock too coarse to see the step)
        st.integers(0, 4_000_000),  # cells attended to
    ),
    max_size=40,
)


@given(
    steps=steps_seen, n_decoding=st.integers(0, 64), at=st.integers(0, 30_000), cells=st.integers(0, 10**6)
)
def test_whatever_was_measured_the_room_is_within_the_batch(
    steps: list[tuple[int, float, int]], n_decoding: int, at: int, cells: int
) -> None:
    """Noise, steps all alike, a clock that saw nothing: no division by zero, no room past the batch."""
    budget = PrefillBudget(fixed=None, n_batch=2048)
    for tokens, seconds, attended in steps:
        budget.observe(tokens, seconds, cells=attended)
    room = budget.room(n_decoding, streams_cells=cells, prompt_at=at)
    assert 1 <= room <= 2048 - n_decoding
    if n_decoding:
        assert room >= min(DEFAULT_MIN_CHUNK, 2048 - n_decoding)


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


def test_a_cost_per_cell_far_below_the_cost_per_token_keeps_its_digits() -> None:
    """The chunk's quadratic, solved where the per-cell part is tiny: the linear answer, not none."""
    assert _root(1e-25, 1e-3, -0.5) == pytest.approx(500.0)
    assert _root(0.0, 1e-3, -0.5) == pytest.approx(500.0)
    assert math.isfinite(_root(0.0, 1e-310, -0.5))  # a cost no clock measures: capped, not infinite
