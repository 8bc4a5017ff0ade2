"""The prompt cache through every dialect, on a real server with the real model.

Each test opens its own conversation (a unique system prompt) so the shared
server's earlier traffic can only show up as snapshots, never as a false hit.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import pytest
from dirty_equals import IsInt

from .conftest import anthropic_client, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

# long enough that its prefix is a real hit (the cache reports hits of at least 64 tokens)
HANDBOOK = " ".join(
    f"Rule {n}: answer in one short sentence, name the source, and never invent a number." for n in range(12)
)


def system_prompt() -> str:
    return f"You are a helpful assistant ({uuid.uuid4().hex}). {HANDBOOK}"


def chat(http: httpx.Client, system: str, question: str) -> dict:
    response = http.post(
        "/v1/chat/completions",
        json={
            "model": "bubo",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def metric(http: httpx.Client, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", http.get("/metrics").text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


class TestOpenAIChat:
    def test_first_request_is_a_miss_with_its_reason(self, http: httpx.Client) -> None:
        usage = chat(http, system_prompt(), "Hello?")["usage"]
        assert usage["gufo"]["cache_hit"] is False
        assert usage["gufo"]["cache_miss_reason"] in ("cold", "no_prefix")
        assert usage["prompt_tokens_details"]["cached_tokens"] < 64

    def test_shared_prefix_is_reused(self, http: httpx.Client) -> None:
        system = system_prompt()
        first = chat(http, system, "Hello?")["usage"]
        second = chat(http, system, "What is the capital of France?")
        usage = second["usage"]
        assert usage["gufo"] == {
            "cache_hit": True,
            "cache_miss_reason": None,
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "cache_snapshots_skipped": IsInt(ge=0),
            "cache_restored_bytes": 0,
        }
        # everything up to the user's turn was reused
        assert usage["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 8
        assert second["timings"]["cache_n"] == usage["prompt_tokens_details"]["cached_tokens"]
        assert second["timings"]["prompt_n"] == usage["prompt_tokens"] - second["timings"]["cache_n"]

    def test_interleaved_conversations_each_keep_their_prefix(self, http: httpx.Client) -> None:
        """A, then one more conversation than there are other slots, then A: A's snapshot is restored.

        The least recently used slot goes to each new conversation, so the fifth takes A's
        slot; A's tokens go to host RAM and come back from there when A returns.
        """
        n_slots = len(http.get("/slots").json())
        alpha = system_prompt()
        chat(http, alpha, "Hello?")
        for _ in range(n_slots):
            chat(http, system_prompt(), "Hello?")
        usage = chat(http, alpha, "And goodbye?")["usage"]
        assert usage["gufo"]["cache_hit"] is True
        assert usage["gufo"]["cache_restored_bytes"] > 0
        assert usage["prompt_tokens_details"]["cached_tokens"] > 200

    def test_metrics_count_cached_tokens(self, http: httpx.Client) -> None:
        before = metric(http, "llamacpp:prompt_tokens_cached_total")
        system = system_prompt()
        chat(http, system, "Hello?")
        cached = chat(http, system, "Hi?")["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert metric(http, "llamacpp:prompt_tokens_cached_total") >= before + cached
        assert 0 < metric(http, "llamacpp:prompt_cache_hit_ratio") <= 1


def test_completion_endpoint_reports_cache_n(http: httpx.Client) -> None:
    """llama-server's /completion: timings.cache_n and tokens_cached."""
    prompt = system_prompt()
    http.post("/completion", json={"prompt": prompt + " Q: one?", "n_predict": 4})
    body = http.post("/completion", json={"prompt": prompt + " Q: two?", "n_predict": 4}).json()
    assert body["timings"]["cache_n"] > 100
    assert body["tokens_cached"] >= body["timings"]["cache_n"]


def test_responses_cached_tokens(server, sdk: contextlib.ExitStack) -> None:
    client = sdk.enter_context(openai_client(server, timeout=60))
    instructions = system_prompt()
    client.responses.create(model="bubo", instructions=instructions, input="Hello?", max_output_tokens=8)
    second = client.responses.create(
        model="bubo", instructions=instructions, input="Goodbye?", max_output_tokens=8
    )
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens > 100


class TestAnthropic:
    @pytest.fixture(name="client")
    def _client(self, server) -> Iterator[anthropic.Anthropic]:
        with anthropic_client(server, timeout=60) as client:
            yield client

    @staticmethod
    def claude_code_system(stamp: str, body: str) -> list[dict[str, str]]:
        """Claude Code's system blocks: a billing line whose cch= changes every turn, then the prompt."""
        header = f"x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch={stamp};"
        return [{"type": "text", "text": header}, {"type": "text", "text": body}]

    def test_volatile_billing_stamp_does_not_defeat_the_cache(self, client: anthropic.Anthropic) -> None:
        """Turn 2 differs from turn 1 in the first line's cch= stamp, yet reuses the whole turn-1 prompt."""
        body = system_prompt()
        question = {"role": "user", "content": "Hello?"}
        first = client.messages.create(
            model="bubo", max_tokens=8, system=self.claude_code_system("4f2a1", body), messages=[question]
        )
        answer = "".join(block.text for block in first.content if block.type == "text")
        turn_two = [
            question,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Thanks."},
        ]
        system = self.claude_code_system("9c07e", body)
        second = client.messages.create(model="bubo", max_tokens=8, system=system, messages=turn_two)
        turn_one_prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
        assert (second.usage.cache_read_input_tokens or 0) >= turn_one_prompt - 8
        counted = client.messages.count_tokens(model="bubo", system=system, messages=turn_two)
        assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) == counted.input_tokens
