"""A draft model (``--model-draft``) on the real engine: SmolLM2 drafting for itself, and a refusal.

A model drafting for itself proposes, greedily, exactly what greedy sampling
then picks: every draft is accepted and the output is the output without
drafting.  The engine's slots have KV caches of their own (``kv_unified=False``),
so two requests at once also get what each gets alone (see test_parallel.py).
``mode="always"`` drafts regardless of cost: on this CPU a model as large as
the model never pays, and the measured policy would not run it (that is
test_generation.py's and test_draft_policy.py's to show).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bubo.domain.generation import GenerationFinished, GenerationRequest
from bubo.domain.sampling import DraftLimits
from bubo.engine._draft_model import IncompatibleDraft
from bubo.engine.llama import DraftOptions, LlamaEngine, LlamaOptions, load_llama_engine
from bubo.tokenizer import HFTokenizer

from .._models import gemma3_path
from ._generation import GREEDY, generate

pytestmark = pytest.mark.llama


def options(model_path: Path, **fields: object) -> LlamaOptions:
    return LlamaOptions(
        model_path=model_path, n_ctx=1024, n_threads=2, n_parallel=2, kv_unified=False, **fields
    )  # type: ignore[arg-type]


@pytest.fixture(name="plain", scope="module")
def _plain(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load_llama_engine(options(model_path, drafting=DraftOptions(draft_max=0)))
    yield engine
    engine.close()


@pytest.fixture(name="drafted", scope="module")
def _drafted(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load_llama_engine(
        options(model_path, drafting=DraftOptions(draft_max=16, mode="always"), draft_model_path=model_path)
    )
    yield engine
    engine.close()


def question(tokenizer: HFTokenizer, topic: str) -> tuple[int, ...]:
    text = f"<|im_start|>user\nWrite two sentences about {topic}.<|im_end|>\n<|im_start|>assistant\n"
    return tuple(tokenizer.encode(text))


async def run(
    engine: LlamaEngine, prompt: tuple[int, ...], max_new: int = 32, **fields: object
) -> tuple[list[int], GenerationFinished]:
    request = GenerationRequest(prompt_tokens=prompt, max_new_tokens=max_new, sampling=GREEDY, **fields)  # type: ignore[arg-type]
    generated = await generate(engine, request)
    return list(generated.ids), generated.finished


async def test_the_model_drafting_for_itself_has_every_greedy_draft_accepted(
    plain, drafted, tokenizer
) -> None:
    prompt = question(tokenizer, "the sea")
    expected, _ = await run(plain, prompt)
    tokens, finished = await run(drafted, prompt)
    assert tokens == expected
    assert finished.stats.draft_tokens > 0
    assert finished.stats.draft_accepted == finished.stats.draft_tokens
    assert drafted.info.draft_model is not None
    assert plain.info.draft_model is None


async def test_the_request_limits_apply(drafted, tokenizer) -> None:
    prompt = question(tokenizer, "mountains")
    _, off = await run(drafted, prompt, speculative=DraftLimits(n_max=0))
    assert off.stats.draft_tokens == 0
    _, unsure = await run(drafted, prompt, speculative=DraftLimits(p_min=1.0))  # no token is that sure
    assert unsure.stats.draft_tokens == 0
    before = drafted.statistics()
    _, short = await run(drafted, prompt, speculative=DraftLimits(n_max=2, p_min=0.0))
    after = drafted.statistics()
    steps = after.draft_steps_total - before.draft_steps_total
    assert steps > 0
    assert short.stats.draft_tokens <= 2 * steps


async def test_two_slots_drafting_at_once_each_get_their_output_alone(plain, drafted, tokenizer) -> None:
    """Each slot's draft sequence follows its own tokens, whichever slot drafted last.

    A generation drafts while it is alone in the batch: the longer one drafts once the shorter ended.
    """
    prompts = [question(tokenizer, topic) for topic in ("rivers", "deserts")]
    lengths = (32, 8)
    alone = [(await run(plain, prompt, n))[0] for prompt, n in zip(prompts, lengths, strict=True)]
    together: dict[int, list[int]] = {}
    finished: dict[int, GenerationFinished] = {}

    async def one(index: int) -> None:
        together[index], finished[index] = await run(drafted, prompts[index], lengths[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(prompts)):
            nursery.start_soon(one, index)
    assert [together[i] for i in range(len(prompts))] == alone
    assert finished[0].stats.draft_tokens > 0


async def test_the_draft_model_sleeps_and_wakes_with_the_model(plain, model_path, tokenizer) -> None:
    """--sleep-idle-seconds frees the draft model too; after the reload it drafts again, every draft accepted."""
    engine = load_llama_engine(
        options(model_path, drafting=DraftOptions(draft_max=16, mode="always"), draft_model_path=model_path)
    )
    try:
        prompt = question(tokenizer, "forests")
        expected, _ = await run(plain, prompt)
        assert await engine.sleep() is True
        assert engine._load.loaded is None  # the draft model was freed with the weights and the context
        tokens, finished = await run(engine, prompt)
        assert tokens == expected
        assert finished.stats.draft_tokens > 0
        assert finished.stats.draft_accepted == finished.stats.draft_tokens
    finally:
        engine.close()


def test_a_draft_model_with_another_vocabulary_is_refused_at_start(model_path: Path) -> None:
    with pytest.raises(IncompatibleDraft, match="cannot draft for this model") as refused:
        load_llama_engine(
            options(model_path, draft_model_path=gemma3_path(), drafting=DraftOptions(draft_max=16))
        )
    assert "gemma" in refused.value.message.lower()
