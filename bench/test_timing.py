"""The benchmark's statistics: percentiles and the inter-token gaps that overlap a prefill."""

from __future__ import annotations

import pytest
import timing


class TestP95:
    def test_interpolates_between_the_values(self) -> None:
        """Twenty-one evenly spaced values: the 95th percentile is the twentieth."""
        assert timing.p95([float(v) for v in range(21)]) == pytest.approx(19.0)

    def test_one_value_is_its_own_percentile(self) -> None:
        assert timing.p95([2.5]) == 2.5

    def test_no_values_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="no values"):
            timing.p95([])


class TestGaps:
    def test_each_arrival_against_the_one_before(self) -> None:
        assert timing.gaps([1.0, 1.5, 3.0]) == pytest.approx([0.5, 1.5])

    def test_one_arrival_has_no_gap(self) -> None:
        assert timing.gaps([1.0]) == []


class TestGapsOverlapping:
    TIMES = (1.0, 2.0, 3.0, 10.0, 11.0, 12.0)

    def test_the_stall_and_its_neighbours_count(self) -> None:
        """A prefill from 3.5 to 9.5 s: the stall from 3 to 10 s is the gap that overlaps it."""
        assert timing.gaps_overlapping(self.TIMES, 3.5, 9.5) == pytest.approx([7.0])

    def test_the_gaps_in_which_the_window_opens_and_closes_count(self) -> None:
        """A window from 1.5 to 10.5 s overlaps every gap from 1 to 11 s."""
        assert timing.gaps_overlapping(self.TIMES, 1.5, 10.5) == pytest.approx([1.0, 1.0, 7.0, 1.0])

    def test_gaps_wholly_before_or_after_do_not_count(self) -> None:
        assert timing.gaps_overlapping(self.TIMES, 20.0, 30.0) == []
        assert timing.gaps_overlapping(self.TIMES, 0.0, 0.5) == []

    def test_an_arrival_exactly_at_the_window_start_ends_no_overlapping_gap(self) -> None:
        """The gap from 1 to 2 s ends where a window from 2 s begins: it is before the window."""
        assert timing.gaps_overlapping(self.TIMES, 2.0, 2.5) == pytest.approx([1.0])


class TestOutlasted:
    def test_a_token_after_the_window(self) -> None:
        assert timing.outlasted([1.0, 5.0], 4.0)

    def test_a_stream_that_ended_inside_the_window(self) -> None:
        assert not timing.outlasted([1.0, 3.0], 4.0)

    def test_a_stream_without_tokens(self) -> None:
        assert not timing.outlasted([], 4.0)
