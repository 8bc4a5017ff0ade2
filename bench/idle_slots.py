"""Idle slots in the unified KV cache: a cold prompt's read with other slots' conversations held, or parked.

Usage: python bench/idle_slots.py [--model PATH] [--prompt 2000] [--held 3000] [--ctx 16384] [--rounds 1]

The real engine in-process (4 slots, unified cache of --ctx tokens, 2 threads),
once with ``--no-cache-idle-slots`` and once with ``--cache-idle-slots`` (the
default).  Each round reads a cold prompt of --prompt tokens into an empty
cache, then three other conversations of --held tokens each (one a slot; they
stay there, or are parked in host RAM as the next request starts), then
another cold prompt of --prompt tokens: its read speed against the first one's
shows what the idle cells cost, since every step attends over the cells up to
the highest one in use.  Prints each read's tokens per second and the cells in
use after it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import trio
from bench_options import bench_options
from prefill_chunk import tokens_of

from bubo.config import default_model_path
from bubo.domain.generation import GenerationRequest, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine

GREEDY = SamplingParams(temperature=0.0)


async def read_s(engine: LlamaEngine, prompt: tuple[int, ...]) -> float:
    """Seconds to the first token of *prompt* (cached as a server caches it)."""
    started = time.perf_counter()
    request = GenerationRequest(prompt_tokens=prompt, max_new_tokens=1, sampling=GREEDY)
    async with engine.open_generation(request) as events:
        async for event in events:
            if isinstance(event, TokenGenerated):
                return time.perf_counter() - started
    raise RuntimeError("no token")


async def one_run(args: argparse.Namespace, options: LlamaOptions, label: str, *, round_: int) -> None:
    engine = load_llama_engine(options)
    try:

        async def read(name: str, n: int, seed: int) -> None:
            seconds = await read_s(engine, tokens_of(engine, n, seed))
            cells = engine.cache_contents().live_tokens
            print(f"idle slots {label} {name:28} {n / seconds:7.1f} tok/s, cells in use {cells}", flush=True)

        await read("cold prompt, empty cache", args.prompt, 1000 * round_)
        for i in range(3):
            await read(f"other conversation {i + 1}", args.held, 1000 * round_ + 10 + i)
        await read("cold prompt, after the three", args.prompt, 1000 * round_ + 2)
    finally:
        engine.close()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prompt", type=int, default=2000)
    parser.add_argument("--held", type=int, default=3000)
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=1)
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, LlamaOptions]:
    """The engine with idle slots kept in the cache, and with them parked in host RAM."""
    model = args.model or default_model_path()
    return {
        label: bench_options(model, n_ctx=args.ctx, n_parallel=4, cache_idle_slots=park)
        for label, park in (("kept", False), ("parked", True))
    }


async def main() -> None:
    args = parser().parse_args()
    loads = engine_options(args)
    for round_ in range(args.rounds):
        for label in ("kept", "parked") if round_ % 2 == 0 else ("parked", "kept"):
            await one_run(args, loads[label], label, round_=round_)


if __name__ == "__main__":
    trio.run(main)
