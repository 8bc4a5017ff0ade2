"""Prompt chunks: a lone prompt's prefill speed; the streams' gaps while a long prompt is read beside them.

Usage: python bench/prefill_chunk.py [--model PATH] [--chunks auto,256,2048] [--rounds 3] [--prompt 1500]

The real engine in-process (4 slots, unified cache, 2 threads).  *Lone*: a cold
prompt of --prompt tokens with nothing else running, its tokens per second
(median of --rounds).  *Beside*: three greedy streams decoding while a prompt of
--prompt tokens arrives; the streams' inter-token gaps while it is read (worst
and p95) and the newcomer's time to first token against the lone prefill time.
Each setting is measured in turn, round by round, so load drifts alike.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import trio
from bench_options import bench_options

from bubo.config import default_model_path
from bubo.domain.generation import GenerationRequest, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine

GREEDY = SamplingParams(temperature=0.0)


def tokens_of(engine: LlamaEngine, n: int, seed: int) -> tuple[int, ...]:
    text = " ".join(f"item {seed}-{i} is listed here." for i in range(n))
    return engine.current.context.tokenize(text)[:n]


async def first_token(engine: LlamaEngine, prompt: tuple[int, ...]) -> float:
    started = time.perf_counter()
    request = GenerationRequest(prompt_tokens=prompt, max_new_tokens=1, sampling=GREEDY, cache_prompt=False)
    async with engine.open_generation(request) as events:
        async for event in events:
            if isinstance(event, TokenGenerated):
                return time.perf_counter() - started
    raise RuntimeError("no token")


async def stream(engine: LlamaEngine, prompt: tuple[int, ...], stamps: list[float], stop: trio.Event) -> None:
    request = GenerationRequest(
        prompt_tokens=prompt, max_new_tokens=4000, sampling=GREEDY, cache_prompt=False, ignore_eos=True
    )
    async with engine.open_generation(request) as events:
        async for event in events:
            if isinstance(event, TokenGenerated):
                stamps.append(time.perf_counter())
            if stop.is_set():
                return


async def beside(engine: LlamaEngine, prompt: tuple[int, ...]) -> tuple[float, float, float]:
    """(worst gap, p95 gap, TTFT) while *prompt* is read beside three streams."""
    stamps: list[list[float]] = [[], [], []]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(stream, engine, tokens_of(engine, 16, 100 + i), stamps[i], stop)
        while min(len(s) for s in stamps) < 8:  # noqa: ASYNC110 - polling the streams' progress
            await trio.sleep(0.05)
        started = time.perf_counter()
        ttft = await first_token(engine, prompt)
        ended = started + ttft
        stop.set()
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s) if b > started and a < ended]
    gaps.sort()
    return gaps[-1], gaps[int(0.95 * (len(gaps) - 1))], ttft


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--chunks", default="auto,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=1500)
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, LlamaOptions]:
    """One engine per prompt chunk setting (``auto``: sized by the streams' gap), by setting."""
    model = args.model or default_model_path()
    return {
        chunk: bench_options(
            model, n_ctx=8192, n_parallel=4, prefill_chunk=0 if chunk == "auto" else int(chunk)
        )
        for chunk in args.chunks.split(",")
    }


async def main() -> None:
    args = parser().parse_args()
    model = args.model or default_model_path()
    chunks = args.chunks.split(",")
    lone: dict[str, list[float]] = {c: [] for c in chunks}
    side: dict[str, list[tuple[float, float, float]]] = {c: [] for c in chunks}
    engines = {c: load_llama_engine(options) for c, options in engine_options(args).items()}
    try:
        for round_ in range(args.rounds):
            for chunk, engine in engines.items():
                prompt = tokens_of(engine, args.prompt, round_)
                lone[chunk].append(await first_token(engine, prompt))
                side[chunk].append(await beside(engine, tokens_of(engine, args.prompt, 50 + round_)))
                print(
                    f"round {round_} chunk {chunk}: lone {lone[chunk][-1]:.2f} s, beside {side[chunk][-1]}",
                    flush=True,
                )
    finally:
        for engine in engines.values():
            engine.close()
    print(f"model {model.name}, prompt {args.prompt} tokens, {args.rounds} rounds (medians)")
    print("chunk  lone tok/s  lone TTFT s  beside: worst gap s  p95 gap s  TTFT s  TTFT/lone")
    for chunk in chunks:
        t_lone = statistics.median(lone[chunk])
        worst, p95, ttft = (statistics.median(x[i] for x in side[chunk]) for i in range(3))
        print(
            f"{chunk:>5}  {args.prompt / t_lone:10.1f}  {t_lone:11.2f}  {worst:19.2f}  {p95:9.2f}"
            f"  {ttft:6.2f}  {ttft / t_lone:9.2f}"
        )


if __name__ == "__main__":
    trio.run(main)
