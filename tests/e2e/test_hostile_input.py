"""Hostile bodies against a real server: each a 4xx, and the server keeps serving (issue 10).

The API tests (tests/api/test_hostile_input.py) hold the full table; this sends
a representative set through Hypercorn to the real engine, where a 500 or a
crash would show.  Ollama's ``keep_alive`` that froze the event loop (issue 36)
goes through a real ``bubo serve``, which a client cannot make free its model
either (``--ollama-keep-alive ignore``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Server, bubo_command, free_port, start_server, stop_server

USER = {"role": "user", "content": "Say hi."}
CHAT = "/v1/chat/completions"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "bubo", "messages": [USER], "max_tokens": 4, **fields}


def assistant_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


# (route, JSON text as sent, the param the 400 names)
HOSTILE = [
    (CHAT, json.dumps(chat(messages=[{"role": "user", "content": "a\ud800b"}])), "messages[0].content"),
    ("/tokenize", json.dumps({"content": "\ud800"}), "content"),
    ("/apply-template", json.dumps({"messages": [{"role": "user", "content": "\udfff"}]}), "messages[0].content"),
    ("/completion", json.dumps({"prompt": "hi", "stop": ["\ud800"], "n_predict": 4}), "stop[0]"),
    ("/v1/completions", json.dumps({"model": "bubo", "prompt": "hi", "stop": [f"s{i}" for i in range(100_000)]}),
     "stop"),
    (CHAT, json.dumps(chat(messages=[USER, assistant_call("[" * 100_000)])),
     "messages[1].tool_calls[0].function.arguments"),
    (CHAT, json.dumps(chat(temperature=0.5)).replace("0.5", "1e309"), "temperature"),
    (CHAT, json.dumps(chat(max_tokens=2**70)), "max_tokens"),
    ("/completion", json.dumps({"prompt": "hi", "n_predict": 2**31}), "n_predict"),
    (CHAT, json.dumps(chat(top_k=2**32 + 5)), "top_k"),
    (CHAT, json.dumps(chat(repeat_penalty=0)), "repeat_penalty"),
]  # fmt: skip


def assert_serving(http: httpx.Client, server: Server) -> None:
    assert server.process.poll() is None, server.output()[-3000:]
    assert http.get("/health").json() == {"status": "ok"}
    answer = http.post(CHAT, json=chat())
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize(("path", "text", "param"), HOSTILE, ids=[f"{p}:{q}" for p, _, q in HOSTILE])
def test_refused_and_still_serving(
    http: httpx.Client, server: Server, path: str, text: str, param: str
) -> None:
    """Each hostile body is a 400 naming the field; the same server then answers normally."""
    response = http.post(path, content=text.encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert_serving(http, server)


def test_extreme_settings_in_range_reach_llama_cpp(http: httpx.Client, server: Server) -> None:
    """The widest values the ranges admit go through llama.cpp's sampler without harm."""
    for fields in (
        {"temperature": 3.4e38, "top_k": 2**31 - 1, "top_p": 1, "min_p": 0},
        {"presence_penalty": -3.4e38, "frequency_penalty": 3.4e38, "repeat_penalty": 3.4e38},
        {"repeat_penalty": 1e-30, "repeat_last_n": -1, "seed": 2**63 - 1, "temperature": 0.7},
        {"logit_bias": {"15": 3.4e38, "16": -3.4e38}, "temperature": 0.7},
    ):
        response = http.post(CHAT, json=chat(**fields))
        assert response.status_code == 200, (fields, response.text)
    assert_serving(http, server)


OLLAMA_MODEL = "smollm2-135m-instruct-q4-1"
# issue 36: "11s" * 28 + " x" held the event loop for minutes (the duration regex backtracked), 30 for 40
FROZE_MAIN = ["11s" * 28 + " x", "11s" * 30 + " x", "11s" * 1_000 + " x", "1s" * 500_000 + " x"]


@pytest.fixture(name="shared", scope="module")
def _shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``bubo serve`` as a shared server: no client's keep_alive may free its model."""
    port = free_port()
    log: Path = tmp_path_factory.mktemp("shared") / "bubo.log"
    command = [bubo_command(), "serve", "--port", str(port), "-np", "1", "--ollama-keep-alive", "ignore"]
    server = start_server(command, port, log)
    yield server
    stop_server(server)


def health_times(http: httpx.Client, count: int) -> list[float]:
    """The round-trip times of *count* /health requests in a row (each must answer ok)."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        assert http.get("/health").status_code == 200
        times.append(time.perf_counter() - start)
    return times


@pytest.mark.e2e
@pytest.mark.llama
def test_the_keep_alive_that_froze_the_server_is_a_400_and_health_keeps_answering(shared: Server) -> None:
    """Each payload is a 400 naming keep_alive, sent over and over while /health answers as it usually does.

    /health is compared with itself just before (no bound on its time of its own); on main the first
    payload alone held it for minutes.
    """
    answers: list[tuple[int, str]] = []

    def hostile() -> None:
        with httpx.Client(base_url=shared.base_url, timeout=60) as client:
            for _ in range(20):
                for keep_alive in FROZE_MAIN:
                    body = {"model": OLLAMA_MODEL, "messages": [USER], "keep_alive": keep_alive}
                    response = client.post("/api/chat", json=body)
                    answers.append((response.status_code, response.text))

    with httpx.Client(base_url=shared.base_url, timeout=60) as http:
        usual = max(health_times(http, 20))
        worker = threading.Thread(target=hostile)
        worker.start()
        during: list[float] = []
        while worker.is_alive():
            during += health_times(http, 1)
        worker.join()
    assert len(answers) == 20 * len(FROZE_MAIN)
    assert all(status == 400 and "keep_alive" in text for status, text in answers), answers[:2]
    assert during, "the payloads were answered before /health could be asked once"
    assert max(during) < 10 * usual + 0.25, (usual, sorted(during)[-5:])


@pytest.mark.e2e
@pytest.mark.llama
def test_no_client_can_free_the_model_of_a_shared_server(shared: Server) -> None:
    """--ollama-keep-alive ignore: keep_alive 0 loads the model as any empty request; it never sleeps."""
    with httpx.Client(base_url=shared.base_url, timeout=120) as http:
        for path in ("/api/generate", "/api/chat"):
            answer = http.post(path, json={"model": OLLAMA_MODEL, "keep_alive": 0})
            assert answer.status_code == 200, answer.text
            assert answer.json()["done_reason"] == "load"
        generated = http.post(
            "/api/generate",
            json={"model": OLLAMA_MODEL, "prompt": "Hi", "stream": False, "keep_alive": 0,
                  "options": {"num_predict": 2}},
        )  # fmt: skip
        assert generated.status_code == 200, generated.text
        time.sleep(0.5)  # keep_alive 0 would free the model as soon as the answer ended
        assert http.get("/props").json()["is_sleeping"] is False
        assert [m["name"] for m in http.get("/api/ps").json()["models"]]
