"""Tokens taken beside the next ``llama_decode``, on the real default model: a client reads the same.

Where a CPU is free (``courier="on"``) the decode thread takes a token whose
verdict can wait (only a stop string could end the generation with it) on
another thread while the next decode runs.  Two engines over the same model,
one taking tokens beside and one at once (``"off"``), with a fixed prompt
chunk so that their steps are alike, give the same tokens, texts,
log-probabilities and ends; a stop string found a step late leaves its last
token's cell in the slot's sequence, which the next turn reuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bubo.domain.generation import GenerationFinished, GenerationRequest, StopCause
from bubo.domain.sampling import SamplingParams
from bubo.engine.llama import LlamaEngine
from bubo.tokenizer import HFTokenizer

from .._llama_options import loaded_engine
from ._generation import GREEDY, Generated, generate

pytestmark = pytest.mark.llama

COUNT = "Count: 1, 2, 3,"  # the model goes on: " 4, 5, 6, ..."
QUESTION = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(name="engines", scope="module")
def _engines(model_path: Path) -> Iterator[dict[str, LlamaEngine]]:
    options = {"model_path": model_path, "n_ctx": 1024, "prefill_chunk": 64}
    with (
        loaded_engine(**options, courier="on") as beside,
        loaded_engine(**options, courier="off") as at_once,
    ):
        yield {"beside": beside, "at once": at_once}


def request(tokenizer: HFTokenizer, text: str, **fields: object) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=tuple(tokenizer.encode(text)), **fields)  # type: ignore[arg-type]


def read(generated: Generated) -> tuple[object, ...]:
    """What a client reads, less the timings."""
    finished = generated.finished
    stats = finished.stats
    return (
        generated.tokens,
        finished.cause,
        finished.stop_word,
        stats.completion_tokens,
        stats.prompt_tokens,
        stats.cached_tokens,
    )


REQUESTS = {
    "to the end of the turn": {"text": QUESTION, "max_new_tokens": 64, "sampling": GREEDY},
    "to the limit, with log-probabilities": {
        "text": COUNT,
        "max_new_tokens": 24,
        "sampling": GREEDY,
        "n_probs": 3,
    },
    "to a stop string, with log-probabilities": {
        "text": COUNT,
        "max_new_tokens": 64,
        "sampling": GREEDY,
        "stop": (" 6",),
        "n_probs": 2,
    },
    "seeded, after the sampler chain": {
        "text": QUESTION,
        "max_new_tokens": 32,
        "sampling": SamplingParams(temperature=0.8, seed=42),
        "n_probs": 2,
        "post_sampling_probs": True,
    },
}


@pytest.mark.parametrize("case", list(REQUESTS))
async def test_a_client_reads_what_takes_at_once_give(engines, tokenizer, case: str) -> None:
    fields = dict(REQUESTS[case])
    text = fields.pop("text")
    generated = {
        way: await generate(engine, request(tokenizer, text, **fields)) for way, engine in engines.items()
    }
    assert generated["beside"].tokens  # type: ignore[union-attr]
    assert read(generated["beside"]) == read(generated["at once"])


async def test_a_stop_found_late_leaves_its_last_token_cached_for_the_next_turn(engines, tokenizer) -> None:
    first = request(tokenizer, COUNT, max_new_tokens=64, sampling=GREEDY, stop=(" 6",), cache_prompt=True)
    ends: dict[str, Generated] = {}
    cached: dict[str, list[int]] = {}
    for way, engine in engines.items():
        ends[way] = await generate(engine, first)
        cached[way] = list(engine.current.context.caches[0].tokens)
    assert ends["beside"].finished.cause is StopCause.STOP_WORD
    ids = list(ends["beside"].ids)
    assert cached["at once"] == [*first.prompt_tokens, *ids[:-1]]  # the stop's last token never evaluated
    assert cached["beside"] == [*first.prompt_tokens, *ids]  # evaluated before its verdict came
    # the next turn goes on from the whole answer: its cells are the answer's, whichever way it was taken
    follow = GenerationRequest(
        prompt_tokens=(*first.prompt_tokens, *ids, *tokenizer.encode(" and then")),
        max_new_tokens=16,
        sampling=GREEDY,
    )
    second = {way: await generate(engine, follow) for way, engine in engines.items()}
    assert second["beside"].ids == second["at once"].ids
    assert second["beside"].finished.stats.cached_tokens == len(first.prompt_tokens) + len(ids)
    assert second["at once"].finished.stats.cached_tokens == len(first.prompt_tokens) + len(ids) - 1


async def test_four_streams_at_once_each_end_as_asked(model_path: Path, tokenizer) -> None:
    stops = (" 4", " 7", " 9", " 12")
    finished: dict[str, GenerationFinished] = {}
    texts: dict[str, str] = {}
    with loaded_engine(model_path=model_path, n_ctx=1024, n_parallel=4, courier="on") as engine:

        async def one(stop: str) -> None:
            generated = await generate(
                engine, request(tokenizer, COUNT, max_new_tokens=64, sampling=GREEDY, stop=(stop,))
            )
            finished[stop], texts[stop] = generated.finished, generated.text

        async with trio.open_nursery() as nursery:
            for stop in stops:
                nursery.start_soon(one, stop)
    for stop in stops:
        assert finished[stop].cause is StopCause.STOP_WORD
        assert finished[stop].stop_word == stop
        assert stop not in texts[stop]
