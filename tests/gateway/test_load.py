"""32 clients at once through smg: no request lost, and the replicas and the gateway agree on the counts.

Each client sends its requests one after another (half of them streamed), so
the gateway holds up to 32 at once over six slots.  Between two scrapes, each
replica's ``bubo:request_duration_seconds_count`` must equal what smg says it
sent that worker (``smg_worker_requests_total{worker=URL}``), and their sum must
equal the requests the clients made and the requests smg routed
(``smg_router_requests_total``).  Numbers: test-artifacts/gateway/load.json.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from tests.gateway import _clients, _metrics, _sessions
from tests.gateway.conftest import Fleet, gateway, write_result

pytestmark = [pytest.mark.e2e, pytest.mark.llama, pytest.mark.gateway]

CLIENTS = 32
REQUESTS_EACH = 4


def test_thirty_two_clients_lose_nothing_and_the_counts_agree(fleet: Fleet, tmp_path: Path) -> None:
    failures = _clients.Failures()
    salt = uuid.uuid4().hex

    def client_work(client: httpx.Client, k: int) -> list[_sessions.Turn]:
        turns = []
        for n in range(REQUESTS_EACH):
            body = {
                "model": running.model,
                "messages": [
                    {"role": "user", "content": f"Client {k} ({salt}), question {n}: name a colour."}
                ],
                "max_tokens": 8,
                "temperature": 0,
            }
            try:
                answer = (
                    _clients.ask_streamed(client, body) if (k + n) % 2 else _clients.ask_plain(client, body)
                )
            except (AssertionError, httpx.TransportError, _clients.StreamBrokenError) as error:
                failures.add_refused(f"client {k} request {n}: {error!r}")
                raise
            turns.append(_sessions.Turn(k, n + 1, int(answer.usage["prompt_tokens"]), 0, 0))
        return turns

    with gateway(fleet, "cache_aware", tmp_path) as running:
        before, gateway_before = fleet.scrapes(), running.scrape()
        turns = _sessions.run_clients(running.url, range(CLIENTS), CLIENTS, client_work)
        after, gateway_after = fleet.scrapes(), running.scrape()

    def gateway_delta(name: str, **labels: str) -> int:
        return round(gateway_after.total(name, **labels) - gateway_before.total(name, **labels))

    replica_requests = _sessions.request_deltas(before, after)
    result = {
        "clients": CLIENTS,
        "requests": len(turns),
        "refused": failures.refused,
        "replica_requests": replica_requests,
        "gateway_worker_requests": [
            gateway_delta(_metrics.GATEWAY_WORKER_REQUESTS, worker=url) for url in fleet.urls
        ],
        "gateway_routed_requests": gateway_delta(_metrics.GATEWAY_ROUTED_REQUESTS),
        "gateway_retries": gateway_delta(_metrics.GATEWAY_RETRIES),
    }
    write_result("load", result)
    print(f"\nload: {result}")  # noqa: T201 - the measured numbers, for the log
    assert failures.refused == [], result
    assert len(turns) == CLIENTS * REQUESTS_EACH
    assert sum(replica_requests) == CLIENTS * REQUESTS_EACH, result
    assert result["gateway_worker_requests"] == replica_requests, result
    assert result["gateway_routed_requests"] == CLIENTS * REQUESTS_EACH, result
