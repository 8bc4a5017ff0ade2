"""The cell ledger: a KV cell that sequences share counts once, and a shift never moves a shared one."""

from __future__ import annotations

from bubo.engine._cells import CellLedger


def ledger_with(*lengths: int) -> CellLedger:
    ledger = CellLedger()
    for seq_id, n in enumerate(lengths):
        ledger.extend(seq_id, n)
    return ledger


class TestCounting:
    def test_cells_of_their_own_add_up(self) -> None:
        ledger = ledger_with(100, 50)
        assert ledger.used() == 150
        assert (ledger.private(0), ledger.private(1)) == (100, 50)

    def test_a_shared_prefix_counts_once(self) -> None:
        ledger = ledger_with(100)
        ledger.share(0, 1, 0, 80)
        ledger.extend(1, 20)  # its own suffix
        assert ledger.length(1) == 100
        assert ledger.used() == 120
        assert (ledger.private(0), ledger.private(1)) == (20, 20)

    def test_a_share_after_a_prefix_of_its_own(self) -> None:
        ledger = ledger_with(100, 10)
        ledger.share(0, 1, 10, 60)  # seq 1 keeps its own 10 cells and takes [10, 60)
        assert ledger.used() == 110
        assert ledger.private(1) == 10

    def test_cells_stay_while_one_holder_remains(self) -> None:
        ledger = ledger_with(100)
        ledger.share(0, 1, 0, 100)
        ledger.share(1, 2, 0, 60)  # a share of a share is the same cells
        assert ledger.used() == 100
        ledger.truncate(0, 0)  # the first holder is evicted
        assert ledger.used() == 100
        assert ledger.private(1) == 40

    def test_cells_some_sequences_hold_count_what_they_share_once(self) -> None:
        """``used_by``: the cells of the sequences named, shared ones once, whoever else holds them too."""
        ledger = ledger_with(100, 0, 30)
        ledger.share(0, 1, 0, 80)
        ledger.extend(1, 20)
        assert ledger.used_by({0, 1}) == 120
        assert ledger.used_by({1}) == 100  # the 80 cells it shares with seq 0 are its too
        assert ledger.used_by({2}) == 30
        assert ledger.used_by(set()) == 0
        assert ledger.used_by({0, 1, 2}) == ledger.used() == 150

    def test_writing_after_a_truncation_makes_new_cells(self) -> None:
        ledger = ledger_with(100)
        ledger.share(0, 1, 0, 100)
        ledger.truncate(0, 50)
        ledger.extend(0, 30)  # positions 50..80 again, but other cells than seq 1's
        assert ledger.used() == 130
        ledger.extend(1, 5)  # seq 1's own cells at 100..105, not seq 0's
        assert ledger.used() == 135


class TestShifting:
    def test_the_end_of_the_last_shared_cell_past_a_position(self) -> None:
        ledger = ledger_with(100)
        ledger.share(0, 1, 0, 60)
        ledger.extend(1, 40)
        assert ledger.shared_end(1, 0) == 60
        assert ledger.shared_end(1, 70) == 70  # nothing shared past 70

    def test_moved_cells_become_the_sequence_own(self) -> None:
        ledger = ledger_with(100)
        ledger.shift(0, 10, 30)  # drop [10, 40), move [40, 100) down
        assert ledger.length(0) == 70
        assert ledger.used() == 70
        assert ledger.private(0) == 70


class TestMovedCells:
    def test_are_the_sequences_own_and_match_no_other(self) -> None:
        ledger = ledger_with(100)
        ledger.share(0, 1, 0, 100)
        ledger.moved(1, 40, 30)  # --cache-reuse moved a run of 30 cells down to position 40
        assert ledger.length(1) == 70
        assert ledger.used() == 130  # the 30 moved cells are 1's own now
        assert ledger.shared_end(1, 40) == 40  # none of them is 0's cell
        assert ledger.private(1) == 30
