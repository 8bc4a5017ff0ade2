"""The prompt cache's disk tier: a long prefix restored from a file after a restart, against reading it cold.

Usage: python bench/disk_restore.py [--model PATH] [--prefix 2000] [--rounds 3] [--threads 2]

The real engine in-process.  A first engine reads a prompt of --prefix tokens and
closes (its live sequence goes to a file).  Each round then loads a fresh engine
on that directory and sends the prompt plus a short new turn: the time to its
first token (the file read and checked in a worker thread, restored, the new
turn read) is compared with an engine without a prompt cache reading the same
prompt cold.  Medians of --rounds; the engine loads are not timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import attrs
import trio
from bench_options import bench_options

from bubo.config import default_model_path
from bubo.domain.generation import GenerationRequest, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine


async def first_token_s(engine: LlamaEngine, prompt: tuple[int, ...]) -> tuple[float, int]:
    """Seconds until the first token, and the prompt tokens that were cached."""
    request = GenerationRequest(
        prompt_tokens=prompt, max_new_tokens=2, sampling=SamplingParams(temperature=0.0)
    )
    started = time.perf_counter()
    first = None
    async with engine.open_generation(request) as events:
        async for event in events:
            if first is None and isinstance(event, TokenGenerated):
                first = time.perf_counter() - started
            if hasattr(event, "stats"):
                cached = event.stats.cached_tokens  # type: ignore[attr-defined]
    assert first is not None
    return first, cached


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def engine_options(args: argparse.Namespace, disk_dir: Path) -> dict[str, LlamaOptions]:
    """The first engine (RAM snapshots only), a cold one (no prompt cache), one on *disk_dir*'s files."""
    first = bench_options(args.model or default_model_path(), n_ctx=args.prefix + 256, n_threads=args.threads)
    return {
        "first": first,
        "cold": attrs.evolve(first, cache_ram_mib=0),
        "disk": attrs.evolve(first, cache_disk_dir=disk_dir, cache_disk_mib=1024),
    }


def main() -> None:
    args = parser().parse_args()
    words = "The lighthouse keeper logged the storm, the tide and every ship that passed. "
    with tempfile.TemporaryDirectory() as directory:
        loads = engine_options(args, Path(directory))
        engine = load_llama_engine(loads["first"])
        text = words * (args.prefix // 12)
        prefix = engine.current.context.tokenize(text)[: args.prefix]
        turn = engine.current.context.tokenize(" What did the keeper log on the last night?")
        engine.close()
        prompt = (*prefix, *turn)
        engine = load_llama_engine(loads["disk"])
        trio.run(first_token_s, engine, prefix)
        engine.close()
        size = sum(f.stat().st_size for f in Path(directory).rglob("*.kvc"))
        cold, warm = [], []
        for _ in range(args.rounds):
            engine = load_llama_engine(loads["cold"])
            seconds, cached = trio.run(first_token_s, engine, prompt)
            engine.close()
            assert cached == 0
            cold.append(seconds)
            engine = load_llama_engine(loads["disk"])
            seconds, cached = trio.run(first_token_s, engine, prompt)
            engine.close()
            assert cached >= len(prefix) - 1, cached
            warm.append(seconds)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    path = loads["first"].model_path
    print(f"model {path.name}, prefix {len(prefix)} tokens + turn {len(turn)}, threads {args.threads}")
    print(f"snapshot file {size / 1e6:.1f} MB; load average {os.getloadavg()[0]:.1f}")
    print(f"first token, cold read:        {cold_s * 1000:8.0f} ms  (rounds: {[round(s, 2) for s in cold]})")
    print(
        f"first token, restored from disk: {warm_s * 1000:6.0f} ms  (rounds: {[round(s, 2) for s in warm]})"
    )
    print(f"ratio: {warm_s / cold_s:.3f}")


if __name__ == "__main__":
    main()
