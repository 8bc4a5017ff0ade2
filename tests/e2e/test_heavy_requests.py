"""Heavy requests against the real server: others are still answered, limits are 400s, the server lives on."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

TEXT = "The quick brown fox jumps over the lazy dog. "


def health_answers_during(server: Server, path: str, body: dict[str, object]) -> tuple[int, int]:
    """POST *body* and count the /health answers received, one after another, while it was being served.

    Counting starts once the last byte of the body is sent and stops when its answer begins.
    A server whose event loop the request froze answers /health only once the request's own
    answer is on its way; several round trips in a row show it was not frozen.
    """
    heavy_status: list[int] = []
    uploaded = threading.Event()
    answer_began = threading.Event()
    payload = json.dumps(body).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 1 << 16):
            yield payload[start : start + (1 << 16)]
        uploaded.set()

    def heavy() -> None:
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        with httpx.stream(
            "POST", server.base_url + path, content=chunks(), headers=headers, timeout=300
        ) as response:
            answer_began.set()
            heavy_status.append(response.status_code)
            response.read()

    worker = threading.Thread(target=heavy)
    worker.start()
    answered = 0
    with httpx.Client(base_url=server.base_url, timeout=300) as client:
        assert uploaded.wait(timeout=60)
        while not answer_began.is_set():
            response = client.get("/health")
            if not answer_began.is_set() and response.status_code == 200:
                answered += 1
    worker.join()
    return answered, heavy_status[0]


class TestNothingFreezes:
    def test_health_answers_while_a_large_text_is_tokenized(self, server: Server) -> None:
        """A 3 MB /tokenize (about 670,000 tokens; it froze everything for seconds) leaves /health answering."""
        answered, status = health_answers_during(server, "/tokenize", {"content": TEXT * 66_000})
        assert status == 200
        assert answered >= 3

    def test_health_answers_while_a_million_ids_are_detokenized(self, server: Server) -> None:
        answered, status = health_answers_during(server, "/detokenize", {"tokens": [1000] * 1_000_000})
        assert status == 200
        assert answered >= 3


class TestLimitsOnTheRealModel:
    def test_a_chat_that_cannot_fit_is_refused_from_its_size(self, server: Server) -> None:
        """10 MB of chat in a 2,048-token context: 400 at once (it was tokenized whole: 15 s, +650 MiB)."""
        body = {"model": "bubo", "messages": [{"role": "user", "content": TEXT * 220_000}]}
        response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["code"], error["param"], error["n_ctx"]) == (
            "context_length_exceeded",
            "messages",
            2048,
        )
        assert "at least" in error["message"]
        assert server.process.poll() is None

    def test_too_many_ids_and_too_large_a_logit_bias_are_400s(self, server: Server) -> None:
        base = server.base_url
        detokenize = httpx.post(base + "/detokenize", json={"tokens": [1000] * 1_100_000}, timeout=120)
        assert (detokenize.status_code, detokenize.json()["error"]["param"]) == (400, "tokens")
        bias = [[f"w{n}", 1.0] for n in range(100_000)]
        completion = httpx.post(base + "/completion", json={"prompt": "Hi", "logit_bias": bias}, timeout=120)
        assert (completion.status_code, completion.json()["error"]["param"]) == (400, "logit_bias")
        answer = httpx.post(base + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=120)
        assert answer.status_code == 200
        assert server.process.poll() is None

    def test_count_tokens_counts_a_long_prompt_whole(self, server: Server) -> None:
        """count_tokens has no context limit: 5 MB of prompt are counted whole."""
        text = TEXT * 110_000
        body = {"model": "bubo", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
        counted = httpx.post(server.base_url + "/v1/messages/count_tokens", json=body, timeout=300)
        assert counted.status_code == 200
        assert counted.json()["input_tokens"] > 1_000_000  # more than /tokenize may answer at once
