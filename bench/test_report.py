"""The table's goals: on Bubo / reference, or on a ratio Bubo measures against itself."""

from __future__ import annotations

import vs_llama_server
from vs_llama_server import Row


class TestVerdict:
    def test_a_goal_on_the_ratio_to_the_reference(self) -> None:
        row = Row("fan-out p50", "fanout_ttft_s", "llama-server-np4", goal=0.3)
        assert row.verdict(ours=9.0, ratio=0.25) == "bubo/ref <= 0.3: met"
        assert row.verdict(ours=1.0, ratio=1.8) == "bubo/ref <= 0.3: not met"

    def test_a_goal_on_bubos_own_value(self) -> None:
        """Restart over a cold read: the reference server's number does not enter."""
        row = Row("restart / cold", "restart_over_cold", "llama-server", goal=0.1, goal_on_value=True)
        assert row.verdict(ours=0.08, ratio=0.09) == "bubo <= 0.1: met"
        assert row.verdict(ours=0.95, ratio=1.0) == "bubo <= 0.1: not met"

    def test_no_goal_no_verdict(self) -> None:
        assert Row("decode", "decode_tok_s", "llama-server").verdict(ours=1.0, ratio=1.0) == ""

    def test_no_ratio_no_verdict(self) -> None:
        """A reference that measured zero gives no ratio to judge."""
        assert Row("x", "x", "llama-server", goal=1.0).verdict(ours=1.0, ratio=None) == ""


class TestRestartRows:
    def test_the_restart_rows_read_the_restarted_bubo(self) -> None:
        """Every restart_* measurement comes from the Bubo the scenario restarts, none from the shared one."""
        rows = [row for row in vs_llama_server.ROWS if row.key.startswith("restart_")]
        assert rows
        assert {row.server for row in rows} == {vs_llama_server.RESTART}
        assert vs_llama_server.RESTART in vs_llama_server.RESTARTED
