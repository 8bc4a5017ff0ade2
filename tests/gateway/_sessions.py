"""Agent-shaped multi-turn sessions sent through the gateway, and what the replicas' caches made of them.

Every session starts with the same long system prompt (a coding agent's rules,
about 1,500 tokens), then adds its own user turns and the model's answers, as a
coding agent does; no request carries an affinity header, so only the gateway's
policy can send a session's next turn to the replica that holds its history.
The system prompt starts with a *salt*, so the sessions of one measurement share
nothing with another's: each starts cold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx
from tests.gateway import _metrics

TOOLS = ("read_file", "write_file", "run_tests", "search_code", "list_directory", "apply_patch")
RULES = 37  # about 1,500 tokens of SmolLM2's tokenizer
ANSWER_TOKENS = 24
# A turn "found its history" when its cached tokens reach its session's previous prompt (less the few
# tokens a template may render differently at the end of a turn): the replica held that session.
TEMPLATE_SLACK = 8


def system_prompt(salt: str) -> str:
    """The shared system prompt of one measurement."""
    lines = [f"You are a careful coding agent working in a repository (run {salt})."]
    for n in range(RULES):
        tool = TOOLS[n % len(TOOLS)]
        lines.append(
            f"Rule {n + 1}: before you call {tool}, say which file and why in one sentence; never invent a "
            f"path, a number or a result, and stop after {n % 5 + 2} steps."
        )
    return "\n".join(lines)


def user_turn(session: int, turn: int) -> str:
    """Session *session*'s *turn*-th user message (1-based): a task, then tool output and follow-ups."""
    module = f"module_{session}"
    if turn == 1:
        return (
            f"Task {session}: the function parse_{module} in src/{module}.py returns None for an empty "
            f"list instead of raising ValueError. Find the cause."
        )
    if turn == 2:
        return (
            f"read_file src/{module}.py returned: def parse_{module}(items): if not items: return None; "
            f"return [int(x) for x in items]. The test test_{module}_empty fails at line {session * 7 + 3}."
        )
    if turn == 3:
        return f"run_tests tests/test_{module}.py: 1 failed, {session + 4} passed. Propose a one-line fix."
    return f"The fix for task {session} passes all tests. Write a one-line commit message."


def turns_of(session: int) -> int:
    """Three or four turns, alternating, so that no policy's cycle lines up with a session's turns."""
    return 3 + session % 2


@attrs.frozen
class Turn:
    """One answered turn and what its usage said."""

    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    previous_prompt_tokens: int  # the session's previous turn's prompt; 0 on the first turn

    @property
    def found_history(self) -> bool:
        return self.turn > 1 and self.cached_tokens >= self.previous_prompt_tokens - TEMPLATE_SLACK


def ask(client: httpx.Client, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    """One chat completion of *model* through the gateway (deterministic, short); its JSON body."""
    body = {"model": model, "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    payload: dict[str, Any] = response.json()
    return payload


def run_session(client: httpx.Client, model: str, system: str, session: int) -> list[Turn]:
    """Every turn of *session*, each sent with the whole conversation so far."""
    messages = [{"role": "system", "content": system}]
    turns: list[Turn] = []
    previous = 0
    for turn in range(1, turns_of(session) + 1):
        messages.append({"role": "user", "content": user_turn(session, turn)})
        payload = ask(client, model, messages)
        usage = payload["usage"]
        prompt = int(usage["prompt_tokens"])
        cached = int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))
        turns.append(Turn(session, turn, prompt, cached, previous))
        previous = prompt
        messages.append({"role": "assistant", "content": payload["choices"][0]["message"]["content"]})
    return turns


def run_clients(
    url: str, sessions: Sequence[int], clients: int, work: Callable[[httpx.Client, int], list[Turn]]
) -> list[Turn]:
    """*sessions* shared out over *clients* threads (session k to client k mod clients), all at once.

    Each client runs its sessions one after another; with several clients their
    turns interleave on the replicas.  A failure in any client fails the call.
    """
    results: list[Turn] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client_loop(mine: Sequence[int]) -> None:
        try:
            with httpx.Client(base_url=url, timeout=600) as client:
                for session in mine:
                    turns = work(client, session)
                    with lock:
                        results.extend(turns)
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            with lock:
                errors.append(error)

    threads = [
        threading.Thread(target=client_loop, args=(sessions[n::clients],), daemon=True)
        for n in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=1800)
    assert not any(thread.is_alive() for thread in threads), "a client did not finish within 30 minutes"
    if errors:
        raise errors[0]
    return sorted(results, key=lambda t: (t.session, t.turn))


def run_sessions(url: str, model: str, salt: str, sessions: int, clients: int) -> list[Turn]:
    """*sessions* agent sessions over one system prompt through the gateway at *url*."""
    system = system_prompt(salt)
    return run_clients(url, range(sessions), clients, lambda client, k: run_session(client, model, system, k))


def request_deltas(before: Sequence[_metrics.Scrape], after: Sequence[_metrics.Scrape]) -> list[int]:
    """Generation requests each replica counted between two scrapes of the fleet."""
    return [
        round(a.total(_metrics.REPLICA_REQUESTS) - b.total(_metrics.REPLICA_REQUESTS))
        for b, a in zip(before, after, strict=True)
    ]


def summarize(
    turns: Sequence[Turn],
    before: Sequence[_metrics.Scrape],
    after: Sequence[_metrics.Scrape],
) -> dict[str, Any]:
    """The measured numbers of one run: cache shares on turns 2+, each replica's share, the cross-check."""
    later = [t for t in turns if t.turn > 1]
    prompt = sum(t.prompt_tokens for t in later)
    cached = sum(t.cached_tokens for t in later)
    requests = request_deltas(before, after)

    def delta(name: str) -> int:
        return round(sum(a.total(name) - b.total(name) for b, a in zip(before, after, strict=True)))

    return {
        "sessions": len({t.session for t in turns}),
        "requests": len(turns),
        "system_prompt_tokens_about": min(t.prompt_tokens for t in turns if t.turn == 1),
        "turn2plus_prompt_tokens": prompt,
        "turn2plus_cached_tokens": cached,
        "turn2plus_cached_share": cached / prompt if prompt else 0.0,
        "turn2plus_found_history": sum(t.found_history for t in later),
        "turn2plus_turns": len(later),
        "replica_requests": requests,
        "replica_request_shares": [n / sum(requests) if sum(requests) else 0.0 for n in requests],
        # the replicas' own counters over the whole run (turn 1 included), against the responses' usage
        "metrics_cached_tokens": delta(_metrics.REPLICA_CACHED_TOKENS),
        "metrics_evaluated_tokens": delta(_metrics.REPLICA_PROMPT_TOKENS),
        "usage_cached_tokens": sum(t.cached_tokens for t in turns),
        "usage_prompt_tokens": sum(t.prompt_tokens for t in turns),
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The runs side by side, for the test's output."""
    lines = [
        f"{'run':<26} {'turn2+ cached':>13} {'history found':>13} {'replica requests':>18}",
    ]
    for name, row in rows.items():
        found = f"{row['turn2plus_found_history']}/{row['turn2plus_turns']}"
        shares = "/".join(str(n) for n in row["replica_requests"])
        lines.append(f"{name:<26} {row['turn2plus_cached_share']:>12.1%} {found:>13} {shares:>18}")
    return "\n".join(lines)
