"""Per-token Python overhead of Bubo's engine: time outside llama.cpp per generated token.

Usage: python bench/token_overhead.py [--tokens 256] [--rounds 5] [--model PATH]

Runs the real engine in-process, as the server does (a trio worker thread
feeding a memory channel that a trio task drains), with ``llama_decode`` and
``llama_sampler_sample`` wrapped in timers.  What is left of the generation's
wall time per token is Bubo's own work: the loop, stop strings, events, the
hand-over to trio.  Drafting is off so that every step is one ``llama_decode``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import llama_cpp
import trio

from bubo.config import default_model_path
from bubo.domain.generation import GenerationFinished, GenerationRequest, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import DraftOptions, LlamaOptions, load_llama_engine
from bubo.model.gguf import read_metadata
from bubo.tokenizer.hf import build_hf_tokenizer

STORY = "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


class Timed:
    """Wraps a llama_cpp function, summing the seconds spent in it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.original: Callable[..., Any] = getattr(llama_cpp, name)
        self.seconds = 0.0

    def __enter__(self) -> Self:
        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return self.original(*args)
            finally:
                self.seconds += time.perf_counter() - started

        setattr(llama_cpp, self.name, timed)
        return self

    def __exit__(self, *_exc: object) -> None:
        setattr(llama_cpp, self.name, self.original)


async def one_round(engine: Any, prompt: tuple[int, ...], tokens: int) -> dict[str, float]:
    request = GenerationRequest(
        prompt_tokens=prompt, max_new_tokens=tokens, ignore_eos=True, sampling=SamplingParams(temperature=0)
    )
    with Timed("llama_decode") as decode, Timed("llama_sampler_sample") as sample:
        first_at = None
        n = 0
        async with engine.open_generation(request) as events:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    n += 1
                    if first_at is None:
                        first_at = time.perf_counter()
                        decode.seconds = sample.seconds = 0.0  # count from the first token on
                elif isinstance(event, GenerationFinished):
                    break
        wall = time.perf_counter() - (first_at or time.perf_counter())
    steps = n - 1
    return {
        "ms_per_token": wall / steps * 1000,
        "decode_ms": decode.seconds / steps * 1000,
        "sample_ms": sample.seconds / steps * 1000,
        "python_ms": (wall - decode.seconds - sample.seconds) / steps * 1000,
    }


async def main_async(model: Path, tokens: int, rounds: int) -> None:
    tokenizer = build_hf_tokenizer(read_metadata(model))
    prompt = tuple(tokenizer.encode(STORY))
    options = LlamaOptions(model_path=model, n_ctx=4096, n_threads=2, drafting=DraftOptions(draft_max=0))
    engine = await trio.to_thread.run_sync(load_llama_engine, options)
    try:
        await one_round(engine, prompt, 8)  # warm up
        results = [await one_round(engine, prompt, tokens) for _ in range(rounds)]
    finally:
        engine.close()
    print(f"{tokens} tokens, median of {rounds} rounds (ms per generated token):")
    for key in ("ms_per_token", "decode_ms", "sample_ms", "python_ms"):
        values = [r[key] for r in results]
        print(f"  {key:13} {statistics.median(values):7.3f}   {[round(v, 3) for v in values]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    trio.run(main_async, args.model or default_model_path(), args.tokens, args.rounds)


if __name__ == "__main__":
    main()
