"""Context shift (llama-server's ``--context-shift``), ``n_keep``, ``cache_prompt``, ``n_indent``
and ``post_sampling_probs``.

Each runs on the real default model with a small context, one slot.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bubo.domain.generation import GenerationRequest, StopCause, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine._sampler import top_candidates
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine

from ._generation import GREEDY, generate

pytestmark = pytest.mark.llama

N_CTX = 256
# A prompt that never ends by itself: the model keeps counting.
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,"


def load(path: Path, **options: object) -> LlamaEngine:
    return load_llama_engine(
        LlamaOptions(model_path=path, n_ctx=N_CTX, n_parallel=1, n_threads=1, **options)  # type: ignore[arg-type]
    )


async def run(engine: LlamaEngine, prompt: tuple[int, ...], max_new: int | None, **fields: object):
    fields.setdefault("sampling", GREEDY)
    fields.setdefault("ignore_eos", True)
    request = GenerationRequest(prompt_tokens=prompt, max_new_tokens=max_new, **fields)  # type: ignore[arg-type]
    generated = await generate(engine, request)
    return list(generated.ids), generated.text, generated.finished


@pytest.fixture(name="shifting")
def _shifting(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load(model_path, context_shift=True)
    yield engine
    engine.close()


@pytest.fixture(name="plain")
def _plain(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load(model_path)
    yield engine
    engine.close()


class TestContextShift:
    async def test_without_it_the_generation_stops_at_the_end_of_the_context(self, plain, tokenizer) -> None:
        prompt = tuple(tokenizer.encode(COUNTING))
        tokens, _, finished = await run(plain, prompt, 400)
        assert finished.cause is StopCause.CONTEXT
        assert len(prompt) + len(tokens) == N_CTX
        assert finished.stats.context_shifts == 0

    async def test_with_it_the_generation_goes_on_past_the_context(self, shifting, tokenizer) -> None:
        """400 tokens from a 256-token context: the oldest are dropped, the generation goes on to its limit.

        Keeping the first tokens (the model's attention sink) keeps it coherent: it counts on to 100.
        """
        prompt = tuple(tokenizer.encode(COUNTING))
        tokens, text, finished = await run(shifting, prompt, 400, n_keep=8)
        assert finished.cause is StopCause.LIMIT
        assert len(tokens) == 400
        assert len(prompt) + len(tokens) > N_CTX
        assert finished.stats.context_shifts >= 1
        assert "100" in text  # still counting coherently past the shift

    async def test_the_cache_mirrors_the_kv_after_a_shift(self, shifting, tokenizer) -> None:
        """n_keep -1 keeps the whole prompt; the cache holds it, then the latest generated tokens."""
        prompt = tuple(tokenizer.encode(COUNTING))
        tokens, _, _ = await run(shifting, prompt, 400, n_keep=-1)
        cached = shifting._current.context.caches[0].tokens
        assert tuple(cached[: len(prompt)]) == prompt
        assert len(cached) < N_CTX
        suffix = cached[len(prompt) :]
        assert suffix == tokens[len(tokens) - len(suffix) - 1 : -1]  # the last token is never evaluated

    async def test_a_shifted_sequence_is_not_reused_past_what_it_kept(self, shifting, tokenizer) -> None:
        """The cells a shift moved were computed with the dropped tokens in view: a prompt that repeats
        the cache's tokens reuses only the kept prefix, and generates what a cold cache generates."""
        prompt = tuple(tokenizer.encode(COUNTING))
        await run(shifting, prompt, 400, n_keep=8)
        cached = tuple(shifting._current.context.caches[0].tokens)
        follow_up = cached + tuple(tokenizer.encode(" and so on"))
        warm, _, finished = await run(shifting, follow_up, 8)
        assert finished.stats.cached_tokens <= 8 + 1  # n_keep after the BOS, if the model adds one
        shifting._current.context.caches[0].clear()
        cold, _, _ = await run(shifting, follow_up, 8)
        assert warm == cold

    async def test_a_shifted_slot_saves_only_what_it_kept(self, shifting, tokenizer, tmp_path) -> None:
        """A slot file holds only exact cells: once restored, its cells are all taken as exact, so the
        cells a shift moved must not be in it."""
        prompt = tuple(tokenizer.encode(COUNTING))
        await run(shifting, prompt, 400, n_keep=8)
        saved = await shifting.save_slot(0, tmp_path / "shifted.bin")
        assert saved.n_tokens <= 8 + 1  # n_keep after the BOS, if the model adds one
        restored = await shifting.restore_slot(0, tmp_path / "shifted.bin")
        assert restored.n_tokens == saved.n_tokens

    async def test_without_a_limit_it_stops_at_the_training_context(self, shifting, tokenizer) -> None:
        """As llama-server: no shifting forever; without n_predict the generation ends at n_ctx_train.

        The model's own (8,192 tokens) takes long to fill on a CPU, so the context is told a smaller one.
        """
        shifting._current.context.n_ctx_train = 400
        prompt = tuple(tokenizer.encode(COUNTING))
        tokens, _, finished = await run(shifting, prompt, None, n_keep=8)
        assert len(prompt) + len(tokens) == 400
        assert finished.cause is StopCause.CONTEXT
        assert finished.stats.context_shifts >= 1


class TestCachePrompt:
    async def test_false_evaluates_the_whole_prompt_again(self, plain, tokenizer) -> None:
        prompt = tuple(tokenizer.encode(COUNTING * 2))
        await run(plain, prompt, 2)
        _, _, reused = await run(plain, prompt, 2)
        _, _, fresh = await run(plain, prompt, 2, cache_prompt=False)
        assert reused.stats.cached_tokens == len(prompt) - 1
        assert fresh.stats.cached_tokens == 0
        assert not fresh.stats.cache.hit
        assert fresh.stats.cache.miss_reason == "disabled"


class TestIndent:
    async def test_a_line_indented_less_ends_the_generation_before_it(self, plain, tokenizer) -> None:
        code = "def f(x):\n    if x:\n        return 1\n    return 2\n\n\ndef g(y):\n"
        prompt = tuple(tokenizer.encode(code))
        _, free_text, _ = await run(plain, prompt, 60)
        _, text, finished = await run(plain, prompt, 60, n_indent=4)
        lines = text.split("\n")
        assert all(line.startswith("    ") or not line.strip() for line in lines[1:])
        assert finished.cause is StopCause.LIMIT
        assert free_text.startswith(text)
        assert len(text) < len(free_text)


class TestPostSamplingProbs:
    """n_probs after the sampler chain: the distribution each token was drawn from."""

    async def logprobs(self, engine: LlamaEngine, tokenizer, sampling: SamplingParams, **fields: object):
        prompt = tuple(tokenizer.encode("The capital of France is"))
        request = GenerationRequest(
            prompt_tokens=prompt,
            max_new_tokens=4,
            sampling=sampling,
            n_probs=5,
            **fields,  # type: ignore[arg-type]
        )
        async with engine.open_generation(request) as events:
            return [event.logprob async for event in events if isinstance(event, TokenGenerated)]

    async def test_top_k_leaves_at_most_k_candidates_summing_to_one(self, plain, tokenizer) -> None:
        sampling = SamplingParams(top_k=2, top_p=1.0, min_p=0.0, seed=7)
        for entry in await self.logprobs(plain, tokenizer, sampling, post_sampling_probs=True):
            assert 1 <= len(entry.top) <= 2
            assert sum(math.exp(t.logprob) for t in entry.top) == pytest.approx(1.0, abs=1e-3)
            assert entry.token_id in [t.token_id for t in entry.top]

    async def test_greedy_is_certain(self, plain, tokenizer) -> None:
        for entry in await self.logprobs(plain, tokenizer, GREEDY, post_sampling_probs=True):
            assert entry.logprob == 0.0
            assert [t.token_id for t in entry.top] == [entry.token_id]

    async def test_without_it_the_raw_softmax_has_every_candidate(self, plain, tokenizer) -> None:
        sampling = SamplingParams(top_k=2, top_p=1.0, min_p=0.0, seed=7)
        for entry in await self.logprobs(plain, tokenizer, sampling):
            assert len(entry.top) == 5
            assert entry.logprob < 0.0

    async def test_top_k_0_gives_the_n_probs_most_probable(self, plain, tokenizer) -> None:
        """With the whole vocabulary kept, the top is n_probs long, most probable first."""
        sampling = SamplingParams(top_k=0, top_p=1.0, min_p=0.0, temperature=1.5, seed=7)
        for entry in await self.logprobs(plain, tokenizer, sampling, post_sampling_probs=True):
            values = [t.logprob for t in entry.top]
            assert len(values) == 5
            assert values == sorted(values, reverse=True)
            assert entry.logprob <= values[0]


class TestTopCandidates:
    """The post-sampling top, chosen without sorting the whole candidate array."""

    @pytest.mark.parametrize("n_top", [0, 1, 3, 7, 50])
    def test_it_is_what_a_stable_sort_of_everything_gives(self, n_top: int) -> None:
        rng = np.random.default_rng(n_top)
        probabilities = rng.choice([0.0, 0.05, 0.1, 0.2], size=40).astype(np.float64)  # many ties, zeros
        ids = rng.permutation(1000)[:40].astype(np.int32)
        order = np.argsort(-probabilities, kind="stable")
        expected = [(int(ids[i]), float(probabilities[i])) for i in order if probabilities[i] > 0][:n_top]
        assert top_candidates(ids, probabilities, n_top) == expected
