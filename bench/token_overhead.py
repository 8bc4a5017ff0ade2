"""Per-token Python overhead of Bubo's engine: the decode thread's time outside llama.cpp.

Usage: python bench/token_overhead.py [--tokens 256] [--rounds 5] [--streams 1,4] [--threads 2]
                                     [--courier auto|on|off] [--model PATH]

Runs the real engine in-process with 4 slots (``--parallel 4``, the server's
default), as the server does: one decode thread, each generation's events
handed to a trio task that drains them.  ``llama_decode`` and
``llama_sampler_sample`` are wrapped in timers that note when each call began
and ended.  With *n* streams generating at once every step is one
``llama_decode`` of *n* tokens; the time between one step's ``llama_decode``
returning and the next one's starting, less the sampling in it, is Bubo's own
work for the step: building the batch, taking each token, stop strings,
events, the hand-over to trio (and waiting for the GIL while trio runs); with
the courier, a token whose take can wait is taken on another thread during
the next ``llama_decode``, and only waking that thread stays in the gap.
Divided by *n* it is the overhead per token per sequence.  Only steps where
every stream is generating count (not the prompts' steps, nor the last
stream's end).  Drafting is off so that every step decodes one token per
stream.  ``--courier`` is the server's flag (the engine's events to trio
through a courier thread, or posted by the decode thread itself).

Besides each round's means, every step of every round is pooled and shown as
p50, p95, p99 and mean per token: the Python work between two ``llama_decode``
calls less sampling (issue 41's target: at most 0.1 ms a token with one
stream), the sampling, and ``llama_decode`` itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import llama_cpp
import trio

from bubo.config import default_model_path
from bubo.domain.generation import GenerationFinished, GenerationRequest
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import LlamaOptions, load_llama_engine
from bubo.model.gguf import read_metadata
from bubo.tokenizer.hf import build_hf_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

import timing
from bench_options import bench_options

SLOTS = 4
PHASES = ("python", "sample", "decode")  # per step, pooled over the rounds


def story(index: int) -> str:
    return (
        f"<|im_start|>user\nWrite a long story about lighthouse keeper number {index}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


class Calls:
    """Wraps a llama_cpp function, noting when each call began and ended (and its batch's size)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.original: Callable[..., Any] = getattr(llama_cpp, name)
        self.spans: list[tuple[float, float, int]] = []

    def __enter__(self) -> Self:
        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return self.original(*args)
            finally:
                size = args[1].n_tokens if self.name == "llama_decode" else 0
                self.spans.append((started, time.perf_counter(), size))

        setattr(llama_cpp, self.name, timed)
        return self

    def __exit__(self, *_exc: object) -> None:
        setattr(llama_cpp, self.name, self.original)


async def one_round(
    engine: Any, prompts: list[tuple[int, ...]], tokens: int, pooled: dict[str, list[float]] | None = None
) -> dict[str, float]:
    """*len(prompts)* greedy generations of *tokens* at once; the steps where all of them generate.

    Each such step's Python time, sampling and ``llama_decode``, in seconds per token
    per sequence, are appended to *pooled* (by the names in ``PHASES``) when given.
    """
    n = len(prompts)

    async def generate(prompt: tuple[int, ...]) -> None:
        request = GenerationRequest(
            prompt_tokens=prompt,
            max_new_tokens=tokens,
            ignore_eos=True,
            sampling=SamplingParams(temperature=0),
        )
        async with engine.open_generation(request) as events:
            async for event in events:
                if isinstance(event, GenerationFinished):
                    break

    with Calls("llama_decode") as decode, Calls("llama_sampler_sample") as sample:
        async with trio.open_nursery() as nursery:
            for prompt in prompts:
                nursery.start_soon(generate, prompt)
    # consecutive steps where every stream generated one token (not the prompts' steps)
    pairs = [(a, b) for a, b in zip(decode.spans, decode.spans[1:], strict=False) if a[2] == b[2] == n]
    gaps, sampling = [], []
    for (_, ended, _), (next_start, _, _) in pairs:
        inside = sum(e - s for s, e, _ in sample.spans if ended <= s and e <= next_start)
        gaps.append(next_start - ended - inside)
        sampling.append(inside)
    if pooled is not None:
        pooled["python"].extend(gap / n for gap in gaps)
        pooled["sample"].extend(inside / n for inside in sampling)
        pooled["decode"].extend((a[1] - a[0]) / n for a, _ in pairs)
    step_ms = statistics.mean(b[0] - a[0] for a, b in pairs) * 1000
    python_ms = statistics.mean(gaps) * 1000
    return {
        "ms_per_step": step_ms,
        "decode_ms": statistics.mean(a[1] - a[0] for a, _ in pairs) * 1000,
        "sample_ms": statistics.mean(sampling) * 1000,
        "python_ms_per_step": python_ms,
        "python_ms_per_token_per_seq": python_ms / n,
        "tok_s": n * 1000 / step_ms,
        "steps": len(gaps),
    }


async def main_async(options: LlamaOptions, tokens: int, rounds: int, streams: list[int]) -> None:
    tokenizer = build_hf_tokenizer(read_metadata(options.model_path))
    engine = await trio.to_thread.run_sync(load_llama_engine, options)
    try:
        for n in streams:
            prompts = [tuple(tokenizer.encode(story(i))) for i in range(n)]
            await one_round(engine, prompts, 8)  # warm up
            pooled: dict[str, list[float]] = {phase: [] for phase in PHASES}
            results = [await one_round(engine, prompts, tokens, pooled) for _ in range(rounds)]
            print(f"{n} stream(s) x {tokens} tokens, {SLOTS} slots; median of {rounds} rounds:")
            for key in results[0]:
                values = [r[key] for r in results]
                print(f"  {key:28} {statistics.median(values):8.3f}   {[round(v, 3) for v in values]}")
            print(f"  per token per sequence, every step of the {rounds} rounds, ms:")
            print(f"  {'':28} {'p50':>8} {'p95':>8} {'p99':>8} {'mean':>8}")
            for phase in PHASES:
                shown = timing.summary([v * 1000 for v in pooled[phase]])
                print(f"  {phase:28} " + " ".join(f"{shown[k]:8.3f}" for k in ("p50", "p95", "p99", "mean")))
    finally:
        engine.close()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", default="1,4", help="comma-separated numbers of concurrent streams")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--courier", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--model", type=Path, default=None)
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, LlamaOptions]:
    """The one engine: :data:`SLOTS` slots, a 4096-token context, drafting off."""
    model = args.model or default_model_path()
    return {
        "engine": bench_options(
            model, n_ctx=4096, n_threads=args.threads, n_parallel=SLOTS, courier=args.courier
        )
    }


def main() -> None:
    arguments = parser()
    args = arguments.parse_args()
    streams = [int(n) for n in args.streams.split(",")]
    if any(n < 1 or n > SLOTS for n in streams):
        arguments.error(f"--streams: each between 1 and {SLOTS}")
    trio.run(main_async, engine_options(args)["engine"], args.tokens, args.rounds, streams)


if __name__ == "__main__":
    main()
