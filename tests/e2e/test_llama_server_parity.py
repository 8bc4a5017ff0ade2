"""What llama.cpp's own server tests rely on, through a real `bubo serve` each.

Each test is a behaviour a llama-server client can count on, found where
llama.cpp's suite (``tools/server/tests/unit``) and Bubo answered differently:
a full shared KV cache, several listening addresses, ``--verbose``'s
``__verbose``, the Responses stream's telemetry.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from .._sse import payloads
from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]


def serve(tmp: Path, *flags: str, env: dict[str, str] | None = None, api_key: str | None = None) -> Server:
    """`bubo serve` on 127.0.0.1 with *flags* (bounded start, stopped by PID by the caller)."""
    port = free_port()
    command = [bubo_command(), "serve", "--port", str(port), "-t", "2", *flags]
    return start_server(command, port, tmp / "serve.log", env=env, api_key=api_key)


@pytest.fixture(name="small_shared_cache", scope="module")
def _small_shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Four slots sharing a KV cache of 256 tokens, as llama.cpp's ``test_completion_unified`` runs."""
    server = serve(tmp_path_factory.mktemp("unified"), "-c", "256", "-np", "4", "--kv-unified")
    yield server
    assert stop_server(server) == 0


def test_a_full_shared_cache_fails_one_request_and_never_cuts_one_short(small_shared_cache: Server) -> None:
    """Four generations of 80 tokens need 4 x 82 cells of 256: one gives way, none stops short.

    A 200 answer carries all 80 tokens it asked for (``stop_type: "limit"``); one that gives way is a
    503 ``context_full`` saying "Context size has been exceeded", as llama-server words it.
    """
    body = {"prompt": "A", "n_predict": 80, "ignore_eos": True, "temperature": 0}
    with (
        httpx.Client(base_url=small_shared_cache.base_url, timeout=120) as http,
        ThreadPoolExecutor(4) as pool,
    ):
        answers = list(pool.map(lambda _: http.post("/completion", json=body), range(4)))
        served = [a.json() for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        assert served
        assert refused
        assert [(s["timings"]["predicted_n"], s["stop_type"], s["truncated"]) for s in served] == [
            (80, "limit", False)
        ] * len(served)
        for answer in refused:
            assert answer.status_code == 503
            assert answer.headers["retry-after"] == "1"
            error = answer.json()["error"]
            assert error["code"] == "context_full"
            assert error["message"].startswith("Context size has been exceeded")
        alone = http.post("/completion", json=body).json()  # the cache is whole again
        assert alone["timings"]["predicted_n"] == 80


def test_a_stream_that_gives_way_ends_with_an_error_event(small_shared_cache: Server) -> None:
    """Streams: the one that gives way gets an error event after its tokens, never a finish chunk."""
    body = {"prompt": "A", "n_predict": 80, "ignore_eos": True, "temperature": 0, "stream": True}

    def stream(http: httpx.Client) -> list[dict[str, Any]]:
        with http.stream("POST", "/completion", json=body) as response:
            assert response.status_code == 200
            return payloads(response.iter_lines())

    with (
        httpx.Client(base_url=small_shared_cache.base_url, timeout=120) as http,
        ThreadPoolExecutor(4) as pool,
    ):
        streams = list(pool.map(lambda _: stream(http), range(4)))
    finished = [events for events in streams if events[-1].get("stop") is True]
    failed = [events for events in streams if "error" in events[-1]]
    assert finished
    assert failed
    assert len(finished) + len(failed) == 4
    assert all(events[-1]["timings"]["predicted_n"] == 80 for events in finished)
    assert all(events[-1]["error"]["code"] == "context_full" for events in failed)


def test_responses_stream_carries_llama_server_s_telemetry(tmp_path: Path) -> None:
    """llama.cpp's ``test_responses_stream_with_llama_telemetry``: -c 256, -b 32, one slot.

    ``return_progress``: each prompt chunk read is a ``response.in_progress`` with ``prompt_progress``;
    ``timings_per_token``: every text delta carries the timings; the last event carries them too.
    """
    server = serve(tmp_path, "-c", "256", "-b", "32", "-ub", "32", "--prefill-chunk", "32", "-np", "1")
    try:
        body = {
            "model": "bubo",
            "input": "This is a test" * 10,
            "max_output_tokens": 8,
            "temperature": 0.8,
            "stream": True,
            "timings_per_token": True,
            "return_progress": True,
        }
        with (
            httpx.Client(base_url=server.base_url, timeout=60) as http,
            http.stream("POST", "/v1/responses", json=body) as response,
        ):
            frames = payloads(response.iter_lines())
    finally:
        assert stop_server(server) == 0
    progress = [f for f in frames if "prompt_progress" in f]
    assert len(progress) >= 2  # the prompt (over 40 tokens) is read in chunks of 32
    assert {f["type"] for f in progress} == {"response.in_progress"}
    assert all(f["prompt_progress"]["processed"] >= f["prompt_progress"]["cache"] for f in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"] > 0
    deltas = [f for f in frames if f["type"] == "response.output_text.delta"]
    assert deltas
    assert all({"prompt_per_second", "predicted_per_second"} <= f["timings"].keys() for f in deltas)
    last = frames[-1]
    assert last["type"] in {"response.completed", "response.incomplete"}
    assert "usage" in last["response"]
    assert last["timings"]["predicted_n"] == last["response"]["usage"]["output_tokens"]


def test_verbose_answers_show_the_rendered_prompt_and_the_raw_output(tmp_path: Path) -> None:
    """llama.cpp's ``test_chat_template_assistant_prefill``: ``__verbose.prompt`` ends with the prefill.

    The prefill's text parts are joined as they are ("Wh" + "ill"), as llama-server appends them.
    """
    server = serve(tmp_path, "-c", "512", "--verbose")
    prefill = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    messages = [
        {"role": "system", "content": "Book"},
        {"role": "user", "content": "What is the best book"},
        {"role": "assistant", "content": prefill},
    ]
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            chat = http.post(
                "/v1/chat/completions", json={"model": "bubo", "max_tokens": 8, "messages": messages}
            )
            legacy = http.post(
                "/v1/completions", json={"model": "bubo", "prompt": "Once upon", "max_tokens": 4}
            )
    finally:
        assert stop_server(server) == 0
    body = chat.json()
    verbose = body["__verbose"]
    assert verbose["prompt"].endswith("<|im_start|>assistant\nWhill")
    assert "<|im_start|>user\nWhat is the best book<|im_end|>" in verbose["prompt"]
    assert verbose["content"] == body["choices"][0]["message"]["content"]
    assert verbose["tokens_predicted"] == body["usage"]["completion_tokens"]
    assert legacy.json()["__verbose"]["prompt"] == "Once upon"


def test_verbose_refuses_to_start_on_an_address_other_than_loopback(tmp_path: Path) -> None:
    """--verbose with --host 0.0.0.0: exit status 2 and one line saying why, before any model loads."""
    finished = subprocess.run(
        [bubo_command(), "serve", "--verbose", "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 2
    assert "--verbose puts the rendered prompt and the raw output in every answer" in finished.stderr
    assert "loopback addresses only, not 0.0.0.0" in finished.stderr


KEY = "test-multiple-addresses"


def test_every_address_of_host_is_served_and_guarded(tmp_path: Path) -> None:
    """llama.cpp's ``test_server_multiple_addresses``: ``--host 127.0.0.1,::1``, the flag over BUBO_HOST.

    Each address answers with the key, refuses without it, streams a completion, and refuses a
    rebound ``Host`` and a cross-site ``Origin`` (the browser boundary holds on both).
    """
    server = serve(
        tmp_path, "-c", "512", "--host", "127.0.0.1,::1", "--api-key", KEY,
        env={"BUBO_HOST": "192.0.2.1"},  # an address no interface has: the flag replaces it
        api_key=KEY,
    )  # fmt: skip
    port = server.base_url.rsplit(":", 1)[1]
    keyed = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "bubo", "prompt": "Once upon a time", "max_tokens": 8, "stream": True}
    try:
        for host in ("127.0.0.1", "[::1]"):
            with httpx.Client(base_url=f"http://{host}:{port}", timeout=60) as http:
                assert http.get("/health", headers=keyed).status_code == 200
                assert http.post("/v1/completions", json={}).status_code == 401
                with http.stream("POST", "/v1/completions", json=body, headers=keyed) as response:
                    assert response.status_code == 200
                    events = [line for line in response.iter_lines() if line.startswith("data: ")]
                assert len(events) > 1
                assert events[-1] == "data: [DONE]"
                rebound = http.get("/v1/models", headers={**keyed, "Host": f"rebind.test:{port}"})
                assert rebound.status_code == 403
                assert rebound.json()["error"]["code"] == "host_not_allowed"
                foreign = http.post(
                    "/v1/completions", json=body, headers={**keyed, "Origin": "http://attacker.test"}
                )
                assert foreign.status_code == 403
                assert foreign.json()["error"]["code"] == "origin_not_allowed"
    finally:
        assert stop_server(server) == 0
