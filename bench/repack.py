"""Weight repacking: what the start-up probe costs, and prefill/decode speed with repacking on and off.

Usage: python bench/repack.py [--model PATH] [--rounds 3] [--prompt 512] [--tokens 128] [--threads 2]

Start-up: `decide_repack("auto")` with an empty verdict cache (the probe runs)
and again with the verdict kept, against loading the model alone.  Speed: the
real engine in-process, a prompt of --prompt tokens evaluated from an empty
cache (prefill) and --tokens greedy steps (decode), the median of --rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import attrs

from bubo.config import default_model_path
from bubo.engine import RepackDecision
from bubo.engine.llama import DraftOptions, LlamaEngine, LlamaOptions, load_llama_engine
from bubo.engine.probe import VerdictCache, decide_repack


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def startup(options: LlamaOptions) -> None:
    with tempfile.TemporaryDirectory() as directory:
        cache = VerdictCache(Path(directory))
        decision: list[RepackDecision] = []
        first = timed(lambda: decision.append(decide_repack("auto", options, timeout_s=120, cache=cache)))
        cached = timed(lambda: decide_repack("auto", options, timeout_s=120, cache=cache))
    load = timed(lambda: load_llama_engine(options).close())
    print(f"probe verdict: {decision[0]}")
    print(
        f"start-up: model load alone {load:.2f} s; probe, first start +{first:.2f} s; cached +{cached:.3f} s"
    )


def speed(engine: LlamaEngine, prompt_tokens: int, tokens: int) -> tuple[float, float]:
    """Prefill and decode tokens per second (cache cleared first)."""
    context = engine._context  # noqa: SLF001 - a benchmark times the context itself
    text = "The quick brown fox jumps over the lazy dog. " * prompt_tokens
    prompt = context.tokenize(text)[:prompt_tokens]
    context.caches[0].clear()
    prefill = 0.0
    for start in range(0, len(prompt), 512):
        prefill += timed(lambda start=start: context.decode(prompt[start : start + 512]))
    decode = 0.0
    for _ in range(tokens):
        token = int(context.logits(-1).argmax())
        decode += timed(lambda token=token: context.decode((token,)))
    context.caches[0].clear()
    return len(prompt) / prefill, tokens / decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    options = LlamaOptions(
        model_path=args.model or default_model_path(),
        n_ctx=2048,
        n_threads=args.threads,
        cache_ram_mib=0,
        drafting=DraftOptions(draft_max=0),
    )
    startup(options)
    for enabled in (True, False):
        engine = load_llama_engine(
            attrs.evolve(options, repack=RepackDecision(enabled=enabled, reason="bench"))
        )
        try:
            runs = [speed(engine, args.prompt, args.tokens) for _ in range(args.rounds)]
        finally:
            engine.close()
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        state = "on " if enabled else "off"
        print(f"repacking {state}: prefill {prefill:7.1f} tok/s, decode {decode:6.1f} tok/s")


if __name__ == "__main__":
    main()
