"""KV cache data types: the cache's memory and prefill/decode speed for f16, q8_0 and q4_0.

Usage: python bench/kv_cache_types.py [--model PATH] [--ctx 2048] [--rounds 3] [--prompt 1024]
       [--tokens 128] [--threads 2] [--types f16,q8_0,q4_0]

Each type loads the real engine in-process (flash attention auto, which llama.cpp turns on for a
quantized V cache), evaluates a --prompt-token prompt from an empty cache and --tokens greedy
steps after it (so decode attends over the whole prompt), the median of --rounds.  The memory is
what /props reports as ``kv_cache``, the size llama.cpp allocates.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench_options import bench_options
from repack import speed

from bubo.config import default_model_path
from bubo.engine.llama import LlamaOptions, load_llama_engine
from bubo.model import KvCacheSize, read_metadata


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--types", default="f16,q8_0,q4_0")
    return parser


def engine_options(args: argparse.Namespace) -> dict[str, LlamaOptions]:
    """One engine per KV cache type (K and V alike), by type."""
    path = args.model or default_model_path()
    return {
        cache_type: bench_options(
            path,
            n_ctx=args.ctx,
            n_threads=args.threads,
            cache_ram_mib=0,
            cache_type_k=cache_type,
            cache_type_v=cache_type,
        )
        for cache_type in args.types.split(",")
    }


def main() -> None:
    args = parser().parse_args()
    loads = engine_options(args)
    metadata = read_metadata(args.model or default_model_path())
    for cache_type, options in loads.items():
        engine = load_llama_engine(options)
        try:
            n_cells = engine.statistics().kv_cache_capacity
            runs = [speed(engine, args.prompt, args.tokens) for _ in range(args.rounds)]
        finally:
            engine.close()
        size = KvCacheSize.of(
            metadata, type_k=options.cache_type_k, type_v=options.cache_type_v, n_ctx=n_cells
        )
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        print(
            f"{cache_type:>6}: KV {size.bytes / 2**20:6.2f} MiB (saves {size.saved_bytes / 2**20:6.2f} MiB), "
            f"prefill {prefill:7.1f} tok/s, decode {decode:6.1f} tok/s"
        )


if __name__ == "__main__":
    main()
