"""``--courier``: the events' way to the event loop changes when trio works, never what a client reads.

Two real servers, one with a courier thread and tokens taken beside
``llama_decode`` (``--courier on``) and one whose decode thread takes each
token and posts each event itself (``off``), answer the same greedy requests
through the OpenAI SDK: the same streamed texts, with and without a stop
string, and on each, two streams side by side ending whole beside a client
that leaves in the middle.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from .conftest import Server, openai_client, serving

PROMPTS = ("Name three rivers.", "Describe a thunderstorm.")
STOPS = [" the", " severe"]  # each answer holds one


@pytest.fixture(name="servers", scope="module")
def _servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("courier")
    flags = ("--parallel", "2", "--ctx-size", "2048")
    with (
        serving(logs / "courier.log", "--courier", "on", *flags) as courier,
        serving(logs / "direct.log", "--courier", "off", *flags) as direct,
    ):
        yield {"courier": courier, "direct": direct}


def greedy_stream(
    server: Server, prompt: str, *, leave_after: int | None = None, stop: list[str] | None = None
) -> tuple[str, str | None]:
    """The text and finish reason of one greedy stream; *leave_after*: close it after that many chunks."""
    with openai_client(server) as client:
        chunks = client.chat.completions.create(
            model="bubo",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=40,
            temperature=0,
            stream=True,
            stop=stop,
        )
        text, finish = "", None
        with contextlib.closing(chunks):
            for received, chunk in enumerate(chunks):
                if received == leave_after:
                    break
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        return text, finish


def test_each_server_says_how_its_events_travel(servers: dict[str, Server]) -> None:
    expected = "events to the event loop: courier, tokens taken beside llama_decode (--courier on)"
    assert expected in servers["courier"].output()
    assert "events to the event loop: direct (--courier off)" in servers["direct"].output()


def test_one_stream_reads_the_same_either_way(servers: dict[str, Server]) -> None:
    texts = {name: [greedy_stream(server, prompt) for prompt in PROMPTS] for name, server in servers.items()}
    assert all(text for text, _ in texts["courier"])
    assert texts["courier"] == texts["direct"]


def test_a_stop_string_ends_a_stream_the_same_either_way(servers: dict[str, Server]) -> None:
    """On the courier's server the stop is found beside the next decode: the client cannot tell."""
    texts = {
        name: [greedy_stream(server, prompt, stop=STOPS) for prompt in PROMPTS]
        for name, server in servers.items()
    }
    assert all(finish == "stop" for _, finish in texts["courier"])
    assert all(stop not in text for text, _ in texts["courier"] for stop in STOPS)
    assert texts["courier"] == texts["direct"]


@pytest.mark.parametrize("way", ["courier", "direct"])
def test_two_streams_side_by_side_and_a_client_that_leaves(servers: dict[str, Server], way: str) -> None:
    """Both streams end whole (a finish reason) beside a client that left; the next request is served as before."""
    server = servers[way]
    alone = [greedy_stream(server, prompt) for prompt in PROMPTS]
    together: dict[int, tuple[str, str | None]] = {}
    threads = [
        threading.Thread(target=lambda i=i: together.__setitem__(i, greedy_stream(server, PROMPTS[i])))
        for i in range(2)
    ]
    leaver = threading.Thread(target=greedy_stream, args=(server, PROMPTS[0]), kwargs={"leave_after": 3})
    for thread in (*threads, leaver):
        thread.start()
    for thread in (*threads, leaver):
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in (*threads, leaver))
    assert sorted(together) == [0, 1]
    assert all(text and finish in ("length", "stop") for text, finish in together.values())
    assert greedy_stream(server, PROMPTS[1]) == alone[1]  # served after as before
