"""Context shift, cache_prompt, return_tokens and several prompts, over httpx against a real server.

The server has a 256-token context shared by two slots, and shifts it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .._sse import payloads
from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

N_CTX = 256
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,"


@pytest.fixture(name="shifting", scope="module")
def _shifting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log: Path = tmp_path_factory.mktemp("shift") / "bubo.log"
    command = [bubo_command(), "serve", "--port", str(port), "-c", str(N_CTX), "-np", "2", "--context-shift"]
    server = start_server(command, port, log, env={"BUBO_THREADS": "1"})
    yield server
    stop_server(server)


@pytest.fixture(name="http")
def _http(shifting: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shifting.base_url, timeout=300) as client:
        yield client


def greedy(http: httpx.Client, prompt: object, **fields: object) -> object:
    response = http.post("/completion", json={"prompt": prompt, "temperature": 0, **fields})
    assert response.status_code == 200, response.text
    return response.json()


class TestContextShift:
    def test_a_generation_goes_on_past_the_context_and_says_it_was_truncated(
        self, http: httpx.Client, shifting: Server
    ) -> None:
        body = greedy(http, COUNTING, n_predict=400, n_keep=8, ignore_eos=True)
        assert body["tokens_predicted"] == 400
        assert body["tokens_evaluated"] + body["tokens_predicted"] > N_CTX
        assert body["truncated"] is True
        assert body["stop_type"] == "limit"
        assert body["generation_settings"]["n_keep"] == 8
        assert shifting.process.poll() is None
        assert greedy(http, "Hello", n_predict=2)["tokens_predicted"] <= 2  # still serving


class TestCachePrompt:
    def test_false_reuses_no_cached_token(self, http: httpx.Client) -> None:
        prompt = "The history of the printing press begins in the fifteenth century, when"
        greedy(http, prompt, n_predict=2, id_slot=0)
        warm = greedy(http, prompt, n_predict=2, id_slot=0)
        cold = greedy(http, prompt, n_predict=2, id_slot=0, cache_prompt=False)
        assert warm["timings"]["cache_n"] > 0
        assert cold["timings"]["cache_n"] == 0
        assert cold["timings"]["prompt_n"] == cold["tokens_evaluated"]


class TestReturnTokens:
    def test_the_ids_are_those_of_the_content(self, http: httpx.Client) -> None:
        body = greedy(http, "The capital of France is", n_predict=8, return_tokens=True)
        assert len(body["tokens"]) == body["tokens_predicted"]
        assert http.post("/detokenize", json={"tokens": body["tokens"]}).json()["content"] == body["content"]
        assert http.post("/tokenize", json={"content": body["content"]}).json()["tokens"] == body["tokens"]


class TestSeveralPrompts:
    """Batched with another sequence, greedy decoding may differ from a sequence alone (llama.cpp's
    logits are not bit-identical across batch shapes), so each answer is checked by its prompt."""

    PROMPTS = ("The capital of France is", "Once upon a time")

    def test_one_result_each_in_order(self, http: httpx.Client) -> None:
        together = greedy(http, list(self.PROMPTS), n_predict=8)
        assert [r["index"] for r in together] == [0, 1]
        assert [r["prompt"] for r in together] == list(self.PROMPTS)
        assert "Paris" in together[0]["content"]
        assert all(r["tokens_predicted"] > 0 for r in together)
        assert {r["id_slot"] for r in together} == {0, 1}  # side by side, one slot each

    def test_streamed_each_prompt_ends_with_its_own_result(self, http: httpx.Client) -> None:
        with http.stream(
            "POST",
            "/completion",
            json={"prompt": list(self.PROMPTS), "n_predict": 8, "temperature": 0, "stream": True},
        ) as response:
            chunks = payloads(response.iter_lines())
        texts = []
        for index, prompt in enumerate(self.PROMPTS):
            own = [c for c in chunks if c["index"] == index]
            assert own[-1]["stop"] is True
            assert own[-1]["prompt"] == prompt
            assert not any(c["stop"] for c in own[:-1])
            texts.append("".join(c["content"] for c in own))
        assert "Paris" in texts[0]
