"""The short pass of `nox -s gateway` that `nox -s tests` runs: three agent sessions through smg's cache_aware.

No affinity header: each session's later turns find its history in the cache
of the replica that served its earlier ones, the replicas count every request
the gateway says it sent them, and their counters agree with the responses'
usage.  The full measurements (12 sessions, round_robin beside cache_aware,
several clients, faults, 32 clients) are marked ``gateway`` and left to
`nox -s gateway`.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from tests.gateway import _metrics, _sessions
from tests.gateway.conftest import Fleet, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

SESSIONS = 3


def test_later_turns_find_their_history_through_cache_aware(fleet: Fleet, tmp_path: Path) -> None:
    with gateway(fleet, "cache_aware", tmp_path) as running:
        before, gateway_before = fleet.scrapes(), running.scrape()
        turns = _sessions.run_sessions(running.url, running.model, uuid.uuid4().hex, SESSIONS, clients=1)
        after, gateway_after = fleet.scrapes(), running.scrape()
    row = _sessions.summarize(turns, before, after)
    later = [t for t in turns if t.turn > 1]
    assert all(t.found_history for t in later), turns
    assert row["turn2plus_cached_share"] >= 0.9, row
    assert sum(row["replica_requests"]) == len(turns), row
    sent = [
        round(
            gateway_after.total(_metrics.GATEWAY_WORKER_REQUESTS, worker=url)
            - gateway_before.total(_metrics.GATEWAY_WORKER_REQUESTS, worker=url)
        )
        for url in fleet.urls
    ]
    assert sent == row["replica_requests"], (sent, row)
    assert row["metrics_cached_tokens"] == row["usage_cached_tokens"], row
