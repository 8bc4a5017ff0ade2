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

import trio

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prefix", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = args.model or default_model_path()
    base = LlamaOptions(model_path=path, n_ctx=args.prefix + 256, n_threads=args.threads)
    words = "The lighthouse keeper logged the storm, the tide and every ship that passed. "
    engine = load_llama_engine(base)
    text = words * (args.prefix // 12)
    prefix = engine._context.tokenize(text)[: args.prefix]  # noqa: SLF001 - a benchmark
    turn = engine._context.tokenize(" What did the keeper log on the last night?")  # noqa: SLF001
    engine.close()
    prompt = (*prefix, *turn)
    with tempfile.TemporaryDirectory() as directory:
        disk = {"cache_disk_dir": Path(directory), "cache_disk_mib": 1024}
        engine = load_llama_engine(LlamaOptions(**{**_fields(base), **disk}))
        trio.run(first_token_s, engine, prefix)
        engine.close()
        size = sum(f.stat().st_size for f in Path(directory).rglob("*.kvc"))
        cold, warm = [], []
        for _ in range(args.rounds):
            engine = load_llama_engine(LlamaOptions(**{**_fields(base), "cache_ram_mib": 0}))
            seconds, cached = trio.run(first_token_s, engine, prompt)
            engine.close()
            assert cached == 0
            cold.append(seconds)
            engine = load_llama_engine(LlamaOptions(**{**_fields(base), **disk}))
            seconds, cached = trio.run(first_token_s, engine, prompt)
            engine.close()
            assert cached >= len(prefix) - 1, cached
            warm.append(seconds)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    print(f"model {path.name}, prefix {len(prefix)} tokens + turn {len(turn)}, threads {args.threads}")
    print(f"snapshot file {size / 1e6:.1f} MB; load average {os.getloadavg()[0]:.1f}")
    print(f"first token, cold read:        {cold_s * 1000:8.0f} ms  (rounds: {[round(s, 2) for s in cold]})")
    print(
        f"first token, restored from disk: {warm_s * 1000:6.0f} ms  (rounds: {[round(s, 2) for s in warm]})"
    )
    print(f"ratio: {warm_s / cold_s:.3f}")


def _fields(options: LlamaOptions) -> dict[str, object]:
    return {name: getattr(options, name) for name in ("model_path", "n_ctx", "n_threads")}


if __name__ == "__main__":
    main()
