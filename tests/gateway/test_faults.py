"""A replica killed (SIGKILL) or stopped (SIGTERM) while agent sessions run through smg.

A stream whose replica is SIGKILLed after its first event ends with smg's error
event (``stream_error``), so the client knows, and its retry is answered.
SIGKILL while sessions run: no client sees an error that a retry could have
avoided (a stream that had begun may break once, and the client sees it break,
then retries the turn); the sessions of the dead replica go on elsewhere and
find their history again on the turn after; the replica, started again on its
port, gets requests again.
SIGTERM, with ``--drain-delay`` (the replica's /ready turns 503 while it still
serves, and smg's one-second health check takes it out before it refuses work):
no failed request at all, streams included, and the replica exits 0.
The numbers go to test-artifacts/gateway/faults-*.json.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.gateway import _clients, _metrics, _sessions
from tests.gateway.conftest import DRAIN_DELAY, Fleet, Gateway, gateway, write_result

pytestmark = [pytest.mark.e2e, pytest.mark.llama, pytest.mark.gateway]

SESSIONS = range(6)
CLIENTS = 3
FAULT_AFTER = 3  # answered turns before the fault: every client is in its first session
RETURN_ROUNDS = 3  # at most this many rounds of fresh sessions (three at once) to see the replica return


def busiest(fleet: Fleet, before: Sequence[_metrics.Scrape]) -> int:
    """The replica running the most requests now (then: the one that took the most since *before*)."""
    now = fleet.scrapes()

    def load(index: int) -> tuple[float, float]:
        return (
            now[index].total("llamacpp:requests_processing"),
            now[index].total(_metrics.REPLICA_REQUESTS) - before[index].total(_metrics.REPLICA_REQUESTS),
        )

    return max(range(len(now)), key=load)


def run(running: Gateway, failures: _clients.Failures, trigger: _clients.Trigger) -> list[_sessions.Turn]:
    system = _sessions.system_prompt(uuid.uuid4().hex)
    streamed = _clients.streamed_sessions(SESSIONS)
    return _sessions.run_clients(
        running.url,
        SESSIONS,
        CLIENTS,
        lambda client, k: _clients.run_resilient_session(
            client, running.model, system, k, failures, streamed=k in streamed, after_turn=trigger.tick
        ),
    )


def wait_for_health(running: Gateway, url: str, healthy: float) -> None:
    """Until smg's ``smg_worker_health`` for *url* is *healthy* (at most 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if running.scrape().total("smg_worker_health", worker=url) == healthy:
                return
        time.sleep(0.2)
    raise AssertionError(f"smg_worker_health{{worker={url}}} never became {healthy}:\n{running.output()}")


def rehomed(turns: Sequence[_sessions.Turn]) -> dict[str, Any]:
    """Sessions whose history was lost once (the dead replica held it) and whether the next turn found it."""
    lost = [t for t in turns if t.turn > 1 and not t.found_history]
    by_turn = {(t.session, t.turn): t for t in turns}
    next_turns = [by_turn[t.session, t.turn + 1] for t in lost if (t.session, t.turn + 1) in by_turn]
    return {
        "turns_that_lost_their_history": [[t.session, t.turn] for t in lost],
        "next_turns": len(next_turns),
        "next_turns_that_found_it": sum(t.found_history for t in next_turns),
    }


def test_a_stream_cut_by_sigkill_says_so_and_its_retry_is_answered(fleet: Fleet, tmp_path: Path) -> None:
    """The only request running is a long stream: its replica dies after the first event."""
    body = {
        "messages": [{"role": "user", "content": f"Count from one to a thousand ({uuid.uuid4().hex})."}],
        "max_tokens": 400,
        "temperature": 0,
    }
    with gateway(fleet, "cache_aware", tmp_path) as running:
        body["model"] = running.model
        killed: list[int] = []
        with httpx.Client(base_url=running.url, timeout=600) as client:
            request = client.build_request("POST", "/v1/chat/completions", json={**body, "stream": True})
            response = client.send(request, stream=True)
            try:
                assert response.status_code == 200
                lines = response.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                victim = busiest(fleet, fleet.scrapes())
                fleet.replicas[victim].process.send_signal(signal.SIGKILL)
                killed.append(victim)
                rest: list[str] = []
                error: BaseException | None = None
                try:
                    rest.extend(lines)
                except httpx.TransportError as broken:
                    error = broken
            finally:
                response.close()
            retry = _clients.ask_plain(client, body)
        fleet.restart(victim)
        wait_for_health(running, fleet.urls[victim], 1)
    result = {
        "first_event": first[:200],
        "events_after_the_kill": len([line for line in rest if line.startswith("data: ")]),
        "last_lines": rest[-3:],
        "transport_error": repr(error),
        "retry_answer_tokens": retry.usage.get("completion_tokens"),
    }
    write_result("faults-stream-cut", result)
    print(f"\nstream cut: {result}")  # noqa: T201 - what the client saw, for the log
    # the client can tell: smg sends an error event (then [DONE]; the OpenAI SDK raises on the event),
    # and no choice finished
    events = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert error is None, result
    assert [e["error"]["type"] for e in events if "error" in e] == ["stream_error"], result
    assert not any(c.get("finish_reason") for e in events for c in e.get("choices", [])), result
    assert retry.text, result


def test_sigkill_mid_run_costs_no_avoidable_error_and_the_replica_returns(
    fleet: Fleet, tmp_path: Path
) -> None:
    failures = _clients.Failures()
    killed: list[int] = []
    before = fleet.scrapes()

    def kill() -> None:
        victim = busiest(fleet, before)
        fleet.replicas[victim].process.send_signal(signal.SIGKILL)
        killed.append(victim)

    trigger = _clients.Trigger(after=FAULT_AFTER, action=kill)
    with gateway(fleet, "cache_aware", tmp_path) as running:
        gateway_before = running.scrape()
        turns = run(running, failures, trigger)
        assert trigger.fired
        (victim,) = killed
        victim_url = fleet.urls[victim]
        gateway_after_kill = running.scrape()
        fleet.restart(victim)
        wait_for_health(running, victim_url, 1)
        returned_before = fleet.scrapes()[victim].total(_metrics.REPLICA_REQUESTS)
        returned = rounds = 0
        while not returned and rounds < RETURN_ROUNDS:  # cache_aware spreads overlapping requests only
            rounds += 1
            _sessions.run_sessions(running.url, running.model, uuid.uuid4().hex, CLIENTS, CLIENTS)
            returned = round(fleet.scrapes()[victim].total(_metrics.REPLICA_REQUESTS) - returned_before)
    result = {
        "victim": victim,
        "turns": len(turns),
        "refused": failures.refused,
        "broken_streams": failures.broken_streams,
        "rehome": rehomed(turns),
        "gateway_retries": gateway_after_kill.total(_metrics.GATEWAY_RETRIES)
        - gateway_before.total(_metrics.GATEWAY_RETRIES),
        "rounds_of_three_sessions_until_the_returned_replica_took_work": rounds,
        "requests_the_returned_replica_took": returned,
    }
    write_result("faults-sigkill", result)
    print(f"\nSIGKILL: {result}")  # noqa: T201 - the measured numbers, for the log
    assert failures.refused == [], result
    assert len(turns) == sum(_sessions.turns_of(k) for k in SESSIONS)  # every session finished
    rehome = result["rehome"]
    assert rehome["next_turns"] >= 1, result  # a session of the dead replica went on elsewhere
    assert rehome["next_turns_that_found_it"] == rehome["next_turns"], result
    assert returned > 0, result


def test_sigterm_with_a_drain_delay_fails_no_request(fleet: Fleet, tmp_path: Path) -> None:
    failures = _clients.Failures()
    stopped: list[int] = []
    before = fleet.scrapes()

    def stop() -> None:
        victim = busiest(fleet, before)
        fleet.replicas[victim].process.send_signal(signal.SIGTERM)
        stopped.append(victim)

    trigger = _clients.Trigger(after=FAULT_AFTER, action=stop)
    with gateway(fleet, "cache_aware", tmp_path) as running:
        gateway_before = running.scrape()
        turns = run(running, failures, trigger)
        assert trigger.fired
        retries = running.scrape().total(_metrics.GATEWAY_RETRIES) - gateway_before.total(
            _metrics.GATEWAY_RETRIES
        )
    (victim,) = stopped
    status = fleet.replicas[victim].process.wait(timeout=120)
    fleet.restart(victim)
    result = {
        "victim": victim,
        "turns": len(turns),
        "refused": failures.refused,
        "broken_streams": failures.broken_streams,
        "exit_status": status,
        "drain_delay": DRAIN_DELAY,
        "gateway_retries": retries,  # requests smg sent again elsewhere (a 503 or a refused connection)
    }
    write_result("faults-sigterm", result)
    print(f"\nSIGTERM: {result}")  # noqa: T201 - the measured numbers, for the log
    assert failures.refused == [], result
    assert failures.broken_streams == [], result
    assert len(turns) == sum(_sessions.turns_of(k) for k in SESSIONS)
    assert status == 0, result
