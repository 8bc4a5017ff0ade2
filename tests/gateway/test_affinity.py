"""Prefix affinity through smg: 12 agent sessions, no affinity header, cache_aware against round_robin.

One run measures both policies, with one client (sessions one after another)
and with four clients at once (sessions interleaved on the replicas).  The
numbers go to test-artifacts/gateway/affinity-<clients>.json and into the
output as a table; the bar is the issue's: with cache_aware at least 90 % of the
prompt tokens of turns 2+ come from the replicas' caches, while every replica
takes a share of the requests once they overlap.  With one client no replica is
ever busier than another, so cache_aware keeps every session on the replica that
first read the shared system prompt (the right place: nothing waits there); the
test asserts that too, so a change in smg's behaviour shows.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.gateway import _metrics, _sessions
from tests.gateway.conftest import Fleet, gateway, write_result

pytestmark = [pytest.mark.e2e, pytest.mark.llama, pytest.mark.gateway]

SESSIONS = 12
POLICIES = ("cache_aware", "round_robin")
BAR = 0.90


def measure(fleet: Fleet, policy: str, clients: int, directory: Path) -> dict[str, Any]:
    """One policy's run: fresh sessions (their own salt) through a gateway of their own."""
    with gateway(fleet, policy, directory) as running:
        before, gateway_before = fleet.scrapes(), running.scrape()
        turns = _sessions.run_sessions(running.url, running.model, uuid.uuid4().hex, SESSIONS, clients)
        after, gateway_after = fleet.scrapes(), running.scrape()
    row = _sessions.summarize(turns, before, after)
    row["policy"], row["clients"] = policy, clients
    row["gateway_worker_requests"] = [
        round(
            gateway_after.total(_metrics.GATEWAY_WORKER_REQUESTS, worker=url)
            - gateway_before.total(_metrics.GATEWAY_WORKER_REQUESTS, worker=url)
        )
        for url in fleet.urls
    ]
    row["turns"] = [
        [t.session, t.turn, t.prompt_tokens, t.cached_tokens, t.previous_prompt_tokens] for t in turns
    ]
    return row


@pytest.mark.parametrize("clients", [1, 4])
def test_cache_aware_serves_turns_from_cache_and_spreads_sessions(
    fleet: Fleet, tmp_path: Path, clients: int
) -> None:
    rows = {
        f"{policy}, {clients} client(s)": measure(fleet, policy, clients, tmp_path) for policy in POLICIES
    }
    path = write_result(f"affinity-{clients}", rows)
    print(f"\n{_sessions.table(rows)}\n(written to {path})")  # noqa: T201 - the measured table, for the log
    for row in rows.values():
        assert row["requests"] == sum(_sessions.turns_of(k) for k in range(SESSIONS))
        # the replicas counted every request, and the gateway sent each where the replica counted it
        assert sum(row["replica_requests"]) == row["requests"], row
        assert row["gateway_worker_requests"] == row["replica_requests"], row
        # the responses' usage and the replicas' counters agree on the cache
        assert row["metrics_cached_tokens"] == row["usage_cached_tokens"], row
        assert row["metrics_evaluated_tokens"] + row["metrics_cached_tokens"] == row["usage_prompt_tokens"], (
            row
        )
    cache_aware = rows[f"cache_aware, {clients} client(s)"]
    assert cache_aware["turn2plus_cached_share"] >= BAR, _sessions.table(rows)
    if clients > 1:  # every replica takes work once requests overlap
        assert all(cache_aware["replica_requests"]), _sessions.table(rows)
    else:  # one request at a time: no replica is busier than another, the session's home keeps it
        assert sorted(cache_aware["replica_requests"]) == [0, 0, row["requests"]], _sessions.table(rows)
    round_robin = rows[f"round_robin, {clients} client(s)"]
    assert cache_aware["turn2plus_found_history"] > round_robin["turn2plus_found_history"], _sessions.table(
        rows
    )
