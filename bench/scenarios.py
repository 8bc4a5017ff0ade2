"""The benchmark's scenarios: each drives one running server over HTTP and returns its numbers.

Every scenario speaks only the API both servers share (llama-server's
``/completion``, OpenAI chat streaming, Anthropic ``count_tokens`` and
``/v1/messages`` streaming) and measures on the client side, so Bubo and
llama-server are timed the same way.  The agent scenarios are in ``agent.py``,
the fairness one in ``fairness.py``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import httpx

TIMEOUT = httpx.Timeout(600.0, connect=10.0)
FIXTURES = Path(__file__).resolve().parent / "fixtures"

WORDS = (
    "the", "keeper", "lit", "a", "lamp", "on", "every", "evening", "while", "ships", "passed",
    "far", "from", "the", "rocks", "and", "gulls", "circled", "over", "grey", "water", "until",
    "morning", "came", "with", "fog", "rain", "wind", "salt", "bread", "tea", "letters", "from",
    "his", "sister", "who", "lived", "inland", "near", "a", "quiet", "river", "where", "orchards",
    "bloomed", "each", "spring", "he", "wrote", "back", "about", "storms", "tides", "stars",
    "engines", "supply", "boats", "broken", "glass", "and", "the", "long", "stairs", "that",
    "wound", "up", "through", "the", "tower", "to", "the", "great", "lens", "polished", "twice",
    "a", "day",
)  # fmt: skip


def prose(n_words: int, seed: int) -> str:
    """Deterministic English-like text (sentences of the words above)."""
    rng = random.Random(seed)
    sentences, count = [], 0
    while count < n_words:
        length = rng.randint(8, 18)
        words = [rng.choice(WORDS) for _ in range(length)]
        sentences.append(" ".join(words).capitalize() + ".")
        count += length
    return " ".join(sentences)


def prose_of_tokens(n_tokens: int, count_tokens: Callable[[str], int], seed: int) -> str:
    """Prose whose token count is within a few tokens of *n_tokens*."""
    n_words = n_tokens
    for _ in range(20):
        text = prose(n_words, seed)
        counted = count_tokens(text)
        if abs(counted - n_tokens) <= 8:
            return text
        n_words = max(1, round(n_words * n_tokens / counted))
    return text


@attrs.frozen
class StreamResult:
    """One streamed completion as the client saw it (llama-server, OpenAI or Anthropic events)."""

    ttft_s: float  # request sent -> first event carrying generated output
    token_times: tuple[float, ...]  # arrival of each event carrying generated output
    text: str  # the generated text, reasoning and tool-call arguments, in arrival order
    final: dict  # the last usage or timings the server sent (Anthropic: message_start's in start_usage)
    events: tuple[dict, ...] = ()  # every event, in order

    @property
    def n_tokens(self) -> int:
        """Generated tokens as the server counted them (a chunk may carry several)."""
        timings, usage = self.final.get("timings", {}), self.final.get("usage", {})
        counted = timings.get("predicted_n") or usage.get("completion_tokens") or usage.get("output_tokens")
        return int(counted or len(self.token_times))

    @property
    def decode_rate(self) -> float:
        """Tokens per second from the first generated chunk to the last."""
        times = self.token_times
        return (self.n_tokens - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def stream(
    client: httpx.Client,
    path: str,
    body: dict,
    *,
    headers: Mapping[str, str] | None = None,
    keep_going: Callable[[float], bool] | None = None,
) -> StreamResult:
    """POST *body* with ``stream: true`` and time every event that carries generated output.

    *keep_going*, when given, hears each such arrival's time; once it answers False
    the stream is closed there (the server sees the client leave).
    """
    started = time.perf_counter()
    ttft = None
    times: list[float] = []
    parts: list[str] = []
    events: list[dict] = []
    final: dict = {}
    # llama-server may close a connection after a stream; never reuse one
    with client.stream(
        "POST",
        path,
        json={**body, "stream": True},
        headers={"Connection": "close", **(headers or {})},
        timeout=TIMEOUT,
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            events.append(event)
            final |= _usage_of(event)
            text = _text_of(event)
            if text or _opens_tool_use(event):
                now = time.perf_counter()
                ttft = now - started if ttft is None else ttft
                times.append(now)
                parts.append(text)
                if keep_going is not None and not keep_going(now):
                    break
    return StreamResult(
        ttft_s=ttft or float("nan"),
        token_times=tuple(times),
        text="".join(parts),
        final=final,
        events=tuple(events),
    )


def _text_of(event: dict) -> str:
    """The generated text or reasoning an event carries (Anthropic: or tool-call arguments)."""
    if "content" in event and "choices" not in event:  # llama-server /completion
        return str(event["content"])
    if event.get("type") == "content_block_delta":  # Anthropic
        delta = event.get("delta") or {}
        return str(delta.get("text") or delta.get("thinking") or delta.get("partial_json") or "")
    choices = event.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def _opens_tool_use(event: dict) -> bool:
    """An Anthropic tool-use block opening: its name is generated output, before any argument."""
    block = event.get("content_block") or {}
    return event.get("type") == "content_block_start" and block.get("type") == "tool_use"


def _usage_of(event: dict) -> dict:
    """The usage or timings an event reports, by the key ``StreamResult.final`` keeps them under."""
    found = {key: event[key] for key in ("usage", "timings") if event.get(key)}
    if event.get("type") == "message_start":  # Anthropic: the prompt's cache report comes first
        found["start_usage"] = (event.get("message") or {}).get("usage") or {}
    return found


def chat_body(system: str, turns: list[dict], max_tokens: int, **extra: object) -> dict:
    return {
        "model": "bubo",
        "messages": [{"role": "system", "content": system}, *turns],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        **extra,
    }


def cold_body(text: str, max_tokens: int = 2) -> dict:
    """A chat request whose prompt no cache can hold: *text* led by a fresh nonce."""
    return chat_body(f"Session {uuid.uuid4().hex}. {text}", [user("Summarise.")], max_tokens)


STORY = "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


def decode(client: httpx.Client, n_tokens: int = 256, repeats: int = 3) -> dict[str, float]:
    """Greedy decode of *n_tokens* (EOS ignored) after a short prompt: tokens per second."""
    rates = []
    for _ in range(repeats):
        body = {"prompt": STORY, "n_predict": n_tokens, "temperature": 0, "ignore_eos": True}
        result = stream(client, "/completion", body)
        rates.append(result.decode_rate)
    return {"decode_tok_s": statistics.median(rates)}


def cold_prefill(client: httpx.Client, text: str, repeats: int = 2) -> dict[str, float]:
    """Time to first token of a prompt no cache can hold (a fresh nonce leads it)."""
    ttfts, prompt_tokens = [], 0
    for _ in range(repeats):
        result = stream(client, "/v1/chat/completions", cold_body(text))
        ttfts.append(result.ttft_s)
        prompt_tokens = result.final.get("usage", {}).get("prompt_tokens", 0)
    ttft = statistics.median(ttfts)
    return {
        "cold_ttft_s": ttft,
        "cold_prompt_tokens": prompt_tokens,
        "cold_prefill_tok_s": prompt_tokens / ttft,
    }


# Between an answer and the next turn an agent reads the answer, runs its tools or waits for
# its user: never less than this.  Both servers get the same pause; Bubo uses it (idle work).
CLIENT_TURN_GAP_S = 0.5


def second_turn(client: httpx.Client, text: str) -> dict[str, float]:
    """TTFT of turn 2 over TTFT of turn 1 in a conversation with a long shared prefix."""
    system = f"Session {uuid.uuid4().hex}. {text}"
    first_turn = [user("Who is the keeper?")]
    first = stream(client, "/v1/chat/completions", chat_body(system, first_turn, 16))
    time.sleep(CLIENT_TURN_GAP_S)
    turns = [*first_turn, {"role": "assistant", "content": first.text}, user("Now say it in five words.")]
    second = stream(client, "/v1/chat/completions", chat_body(system, turns, 2))
    return {
        "turn1_ttft_s": first.ttft_s,
        "turn2_ttft_s": second.ttft_s,
        "turn2_over_turn1": second.ttft_s / first.ttft_s,
        "turn2_cached_tokens": second.final.get("timings", {}).get("cache_n", float("nan")),
    }


def count_tokens(client: httpx.Client, text: str, repeats: int = 20) -> dict[str, float]:
    """Latency of ``/v1/messages/count_tokens`` for one long user message."""
    body = {"model": "bubo", "messages": [user(text)]}
    client.post("/v1/messages/count_tokens", json=body, timeout=TIMEOUT).raise_for_status()  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.post("/v1/messages/count_tokens", json=body, timeout=TIMEOUT)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
    return {"count_tokens_ms": statistics.median(times) * 1000, "counted": response.json()["input_tokens"]}


STREAM_TOKENS = 128  # each concurrent stream's length


def story_bodies(count: int, n_tokens: int, eog: tuple[int, ...]) -> list[dict]:
    """*count* chat requests for stories of exactly *n_tokens*, distinct short prompts no cache holds.

    The end-of-generation tokens get a logit bias of -100 (the OpenAI field both
    servers honour; llama-server's own ``ignore_eos`` does the same), so every
    stream generates its whole length on both servers and the work is the same.
    """
    nonce = uuid.uuid4().hex
    bias = {str(token): -100 for token in eog}
    return [
        chat_body(
            f"You are storyteller number {index} ({nonce}).",
            [user(f"Tell story {index} about a lighthouse, going on from this: {prose(60, seed=index)}")],
            n_tokens,
            logit_bias=bias,
        )
        for index in range(count)
    ]


def parallel_streams(
    client: httpx.Client, eog: tuple[int, ...], streams: int, n_tokens: int = STREAM_TOKENS
) -> dict[str, float | list[float]]:
    """*streams* chat streams sent at once, distinct prompts, each exactly *n_tokens* long.

    Returns the total throughput (all generated tokens over the wall time from
    the moment every request is sent to the last stream's end), each stream's
    time to first token (a list, pooled over rounds for percentiles), and the
    fewest tokens a stream made (to check the length really was reached).
    """
    bodies = story_bodies(streams, n_tokens, eog)
    go = threading.Barrier(streams + 1)

    def one(body: dict) -> StreamResult:
        with httpx.Client(base_url=str(client.base_url)) as own:
            go.wait()
            return stream(own, "/v1/chat/completions", body)

    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        futures = [pool.submit(one, body) for body in bodies]
        go.wait()
        started = time.perf_counter()
        results = [future.result() for future in futures]
    wall = time.perf_counter() - started
    tokens = sum(r.n_tokens for r in results)
    return {
        f"streams{streams}_tok_s": tokens / wall,
        f"streams{streams}_ttft_s": [r.ttft_s for r in results],
        f"streams{streams}_min_tokens": min(r.n_tokens for r in results),
    }


def copy_edit(client: httpx.Client, n_tokens: int = 400) -> dict[str, float | str]:
    """Greedy edit of code the prompt contains: decode speed and what drafting did."""
    source = (FIXTURES / "inventory.py").read_text()
    question = (
        "Rewrite this Python module with the class Inventory renamed to Stock. "
        f"Reply with the whole module only.\n\n```python\n{source}```"
    )
    body = chat_body("You are a careful programmer.", [user(question)], n_tokens)
    result = stream(client, "/v1/chat/completions", body)
    usage, timings = result.final.get("usage", {}), result.final.get("timings", {})
    drafted = usage.get("draft_tokens", timings.get("draft_n", 0)) or 0
    accepted = usage.get("draft_tokens_accepted", timings.get("draft_n_accepted", 0)) or 0
    return {
        "copy_tok_s": result.decode_rate,
        "copy_tokens": result.n_tokens,
        "copy_drafted": drafted,
        "copy_accepted": accepted,
        "copy_text_hash": hashlib.blake2b(result.text.encode(), digest_size=4).hexdigest(),
    }


def user(text: str) -> dict:
    return {"role": "user", "content": text}
