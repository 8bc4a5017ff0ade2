"""Clients that tell apart what a failure cost them: a refused request, or a stream cut after it started.

An agent retries a stream that broke after it began (it saw the break: an error
event, or the body ending without ``[DONE]``); an error before the first byte is
one the gateway could have retried on another replica.  Each turn here records
which of the two happened, and retries only the first kind, once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx
from tests.gateway import _sessions


@attrs.define
class Failures:
    """What the clients saw go wrong, shared by their threads."""

    refused: list[str] = attrs.field(factory=list)  # a non-2xx or a transport error before any byte
    broken_streams: list[str] = attrs.field(factory=list)  # a started stream that ended without [DONE]
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def add_refused(self, what: str) -> None:
        with self.lock:
            self.refused.append(what)

    def add_broken(self, what: str) -> None:
        with self.lock:
            self.broken_streams.append(what)


class StreamBrokenError(Exception):
    """A stream that had begun (200 and at least one event) ended without its end: the client can tell."""


@attrs.frozen
class Answer:
    text: str
    usage: dict[str, Any]


def ask_plain(client: httpx.Client, body: dict[str, Any]) -> Answer:
    """A non-streamed chat completion. Anything but a 200 is a refusal."""
    response = client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise AssertionError(f"{response.status_code}: {response.text[:300]}")
    payload = response.json()
    return Answer(str(payload["choices"][0]["message"]["content"]), payload["usage"])


def ask_streamed(client: httpx.Client, body: dict[str, Any]) -> Answer:
    """A streamed chat completion, its usage in the last event (``include_usage``).

    A non-200 or a transport error before any event is a refusal (AssertionError
    or httpx's error); an error event, or the body ending or breaking without
    ``[DONE]`` after events came, is StreamBrokenError.
    """
    parts: list[str] = []
    usage: dict[str, Any] = {}
    events = 0
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise AssertionError(f"{response.status_code}: {response.text[:300]}")
        try:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return Answer("".join(parts), usage)
                event = json.loads(line[6:])
                events += 1
                if "error" in event:
                    raise StreamBrokenError(f"error event after {events - 1} events: {event['error']}")
                usage = event.get("usage") or usage
                parts.extend(
                    choice.get("delta", {}).get("content") or "" for choice in event.get("choices", [])
                )
        except httpx.TransportError as error:
            if events == 0:
                raise
            raise StreamBrokenError(f"broke after {events} events: {error!r}") from error
    if events == 0:
        raise AssertionError("a 200 stream with no event and no [DONE]")
    raise StreamBrokenError(f"ended after {events} events without [DONE]")


def run_resilient_session(
    client: httpx.Client,
    model: str,
    system: str,
    session: int,
    failures: Failures,
    *,
    streamed: bool,
    after_turn: Callable[[], None] = lambda: None,
) -> list[_sessions.Turn]:
    """A session whose turns are retried once after a broken stream; a refusal is recorded and fails it.

    *after_turn* runs after each answered turn (a test's fault injector counts turns with it).
    """
    messages = [{"role": "system", "content": system}]
    turns: list[_sessions.Turn] = []
    previous = 0
    for turn in range(1, _sessions.turns_of(session) + 1):
        messages.append({"role": "user", "content": _sessions.user_turn(session, turn)})
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": _sessions.ANSWER_TOKENS,
            "temperature": 0,
        }
        answer: Answer | None = None
        for attempt in range(2):
            try:
                answer = ask_streamed(client, body) if streamed else ask_plain(client, body)
                break
            except StreamBrokenError as broken:
                failures.add_broken(f"session {session} turn {turn} attempt {attempt}: {broken}")
            except (AssertionError, httpx.TransportError) as refused:
                failures.add_refused(f"session {session} turn {turn}: {refused!r}")
                raise
        assert answer is not None, f"session {session} turn {turn}: the stream broke twice"
        prompt = int(answer.usage["prompt_tokens"])
        cached = int((answer.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        turns.append(_sessions.Turn(session, turn, prompt, cached, previous))
        previous = prompt
        messages.append({"role": "assistant", "content": answer.text})
        after_turn()
    return turns


def streamed_sessions(sessions: Sequence[int]) -> set[int]:
    """Odd sessions stream, even ones do not."""
    return {k for k in sessions if k % 2}


@attrs.define
class Trigger:
    """Runs *action* once, in the client thread that answers the *after*-th turn of a run."""

    after: int
    action: Callable[[], None]
    answered: int = 0
    fired: bool = False
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def tick(self) -> None:
        with self.lock:
            self.answered += 1
            due = self.answered == self.after
        if due:
            self.action()
            self.fired = True
