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
from bench_options import bench_options

from bubo.config import default_model_path
from bubo.engine import RepackDecision
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine
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
    context = engine.current.context  # a benchmark times the context itself
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


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, LlamaOptions]:
    """The start-up probe's options (repacking as the probe decides), then repacking on and off."""
    probed = bench_options(
        args.model or default_model_path(), n_ctx=2048, n_threads=args.threads, cache_ram_mib=0
    )
    return {
        "probe": probed,
        **{
            state: attrs.evolve(probed, repack=RepackDecision(enabled=enabled, reason="bench"))
            for state, enabled in (("on", True), ("off", False))
        },
    }


def main() -> None:
    args = parser().parse_args()
    options = engine_options(args)
    startup(options.pop("probe"))
    for state, chosen in options.items():
        engine = load_llama_engine(chosen)
        try:
            runs = [speed(engine, args.prompt, args.tokens) for _ in range(args.rounds)]
        finally:
            engine.close()
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        print(f"repacking {state:3}: prefill {prefill:7.1f} tok/s, decode {decode:6.1f} tok/s")


if __name__ == "__main__":
    main()
