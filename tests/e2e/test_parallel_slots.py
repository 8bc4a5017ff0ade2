"""Parallel slots seen by real clients: the official SDKs stream side by side, some leave, all slots idle after.

The session server has four slots (``--parallel`` auto with a 2,048-token context).
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest

from .conftest import Server, anthropic_client, openai_client

TOPICS = ("whales", "volcanoes", "glaciers", "tides", "comets", "forests", "deserts", "coral")


def wait_all_idle(http: httpx.Client, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        slots = http.get("/slots").json()
        if not any(slot["is_processing"] for slot in slots):
            return
        time.sleep(0.02)
    raise AssertionError(f"slots still busy after {seconds} s: {slots}")


def test_four_streams_are_generated_side_by_side(server: Server, http: httpx.Client) -> None:
    """Every stream's first token arrives before any stream ends: nobody waited for another to finish."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    texts: dict[int, str] = {}

    def stream(index: int) -> None:
        with openai_client(server) as client:
            chunks = client.chat.completions.create(
                model="bubo",
                messages=[{"role": "user", "content": f"Write a long essay about {TOPICS[index]}."}],
                max_tokens=96,
                temperature=0,
                stream=True,
            )
            text = ""
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    first.setdefault(index, time.monotonic())
                    text += chunk.choices[0].delta.content
            last[index] = time.monotonic()
            texts[index] = text

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(texts) == [0, 1, 2, 3]
    assert all(texts.values())
    assert max(first.values()) < min(last.values())
    wait_all_idle(http)


LEFT = "left"


def openai_stream(server: Server, index: int, *, leave: bool) -> str:
    """Stream a chat answer with the OpenAI SDK: its finish reason, or LEFT after two chunks."""
    with openai_client(server) as client:
        chunks = client.chat.completions.create(
            model="bubo",
            messages=[{"role": "user", "content": f"Tell me about {TOPICS[index]}."}],
            max_tokens=48,
            stream=True,
        )
        with contextlib.closing(chunks):
            reason = ""
            for received, chunk in enumerate(chunks):
                if leave and received == 2:
                    return LEFT
                if chunk.choices and chunk.choices[0].finish_reason:
                    reason = chunk.choices[0].finish_reason
            return reason


def anthropic_stream(server: Server, index: int, *, leave: bool) -> str:
    """Stream a message with the Anthropic SDK: its stop reason, or LEFT after two text chunks."""
    with (
        anthropic_client(server) as client,
        client.messages.stream(
            model="bubo",
            max_tokens=48,
            messages=[{"role": "user", "content": f"Tell me about {TOPICS[index]}."}],
        ) as events,
    ):
        for received, _ in enumerate(events.text_stream):
            if leave and received == 2:
                return LEFT
        return events.get_final_message().stop_reason or ""


def test_eight_clients_of_both_sdks_some_leaving_mid_stream(server: Server, http: httpx.Client) -> None:
    """More clients than slots, three walk away after two chunks: the rest finish, then every slot is idle."""
    outcomes: dict[int, str | BaseException] = {}
    leaving = {1, 4, 6}

    def run(index: int) -> None:
        stream = openai_stream if index % 2 == 0 else anthropic_stream
        try:
            outcomes[index] = stream(server, index, leave=index in leaving)
        except Exception as error:  # noqa: BLE001 - reported by the test
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert {index for index, outcome in outcomes.items() if outcome == LEFT} == leaving
    finished = {outcome for index, outcome in outcomes.items() if index not in leaving}
    assert len(outcomes) == 8
    assert finished <= {"stop", "length", "end_turn", "max_tokens"}
    wait_all_idle(http)
    metrics = http.get("/metrics").text
    assert "llamacpp:requests_processing 0.0" in metrics
    assert "llamacpp:requests_deferred 0.0" in metrics


class TestSlotsEndpoint:
    def test_every_slot_is_listed(self, http: httpx.Client) -> None:
        slots = http.get("/slots").json()
        assert [slot["id"] for slot in slots] == [0, 1, 2, 3]
        assert http.get("/props").json()["total_slots"] == 4

    @pytest.mark.parametrize("slot", [0, 3])
    def test_id_slot_pins_the_slot(self, http: httpx.Client, slot: int) -> None:
        body = {"prompt": "The sea is", "n_predict": 4, "id_slot": slot}
        before = http.get("/slots").json()[slot].get("id_task")  # absent before the slot's first task
        assert http.post("/completion", json=body).json()["id_slot"] == slot
        after = http.get("/slots").json()[slot]
        assert after["id_task"] != before  # the slot's last task is this one
        assert after["n_prompt_tokens"] >= 3

    def test_an_id_slot_that_does_not_exist_is_a_400(self, http: httpx.Client) -> None:
        response = http.post("/completion", json={"prompt": "The sea is", "n_predict": 4, "id_slot": 4})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "id_slot"
