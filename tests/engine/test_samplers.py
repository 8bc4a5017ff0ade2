"""Each llama.cpp sampler changes what the real default model (SmolLM2-135M-Instruct) samples as it should."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import llama_cpp
import pytest

from bubo.domain.generation import GenerationRequest, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine._dry_stages import DryKey, DryStages, look_back, new_dry_stage
from bubo.engine.errors import EngineFailure
from bubo.engine.llama import LlamaEngine
from bubo.tokenizer import HFTokenizer

from .._llama_options import loaded_engine
from ._generation import GREEDY
from .test_llama import run

pytestmark = pytest.mark.llama

STORY = "<|im_start|>user\nWrite a story about a dragon.<|im_end|>\n<|im_start|>assistant\n"
REPETITIVE = "the cat sat on the mat. " * 4 + "the cat"
# temperature 1 with every filter off: the model's own distribution
UNFILTERED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
SEEDS = (1, 2, 3)


@pytest.fixture(name="engine", scope="module")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(model_path=model_path, n_ctx=512, n_threads=2) as engine:
        yield engine


async def tokens(
    engine: LlamaEngine,
    tokenizer: HFTokenizer,
    sampling: SamplingParams,
    *,
    text: str = STORY,
    n: int = 8,
    n_probs: int | None = None,
) -> list[TokenGenerated]:
    engine.prepare_sampling(sampling)
    request = GenerationRequest(
        prompt_tokens=tuple(tokenizer.encode(text)), max_new_tokens=n, sampling=sampling, n_probs=n_probs
    )
    _text, generated, _finished = await run(engine, request)
    return generated


async def ids(
    engine: LlamaEngine, tokenizer: HFTokenizer, sampling: SamplingParams, **kwargs: object
) -> list[int]:
    return [t.token_id for t in await tokens(engine, tokenizer, sampling, **kwargs)]  # type: ignore[arg-type]


async def per_seed(engine: LlamaEngine, tokenizer: HFTokenizer, sampling: SamplingParams) -> list[list[int]]:
    return [await ids(engine, tokenizer, attrs.evolve(sampling, seed=seed)) for seed in SEEDS]


def repeated_ngrams(context: list[int], generated: list[int], n: int = 3) -> int:
    """How many of the generated tokens end an n-gram that occurred before it (in the prompt or the output)."""
    everything = context + generated
    count = 0
    for end in range(len(context), len(everything)):
        gram = tuple(everything[end - n + 1 : end + 1])
        earlier = {tuple(everything[i : i + n]) for i in range(end - n + 1)}
        count += gram in earlier
    return count


class TestSeed:
    async def test_a_seed_reproduces_and_seeds_differ(self, engine, tokenizer) -> None:
        """The same seed samples the same tokens; different seeds sample different ones."""
        first = await per_seed(engine, tokenizer, UNFILTERED)
        again = await per_seed(engine, tokenizer, UNFILTERED)
        assert first == again
        assert len({tuple(answer) for answer in first}) == len(SEEDS)


class TestNarrowing:
    async def test_top_n_sigma_keeps_only_the_top_logit(self, engine, tokenizer) -> None:
        """A tiny top_n_sigma keeps only the most likely token: temperature 1 samples the greedy answer."""
        greedy = await ids(engine, tokenizer, GREEDY)
        assert await per_seed(engine, tokenizer, attrs.evolve(UNFILTERED, top_n_sigma=0.001)) == [greedy] * 3

    async def test_typical_p_keeps_the_typical_token(self, engine, tokenizer) -> None:
        """A tiny typical_p keeps one token, the one whose surprise is nearest the entropy: no seed changes
        the answer, and it is not the greedy one."""
        answers = await per_seed(engine, tokenizer, attrs.evolve(UNFILTERED, typical_p=0.001))
        assert answers[0] == answers[1] == answers[2]
        assert answers[0] != await ids(engine, tokenizer, GREEDY)

    async def test_dynatemp_range_samples_around_temperature_zero(self, engine, tokenizer) -> None:
        """temperature 0 with a dynamic range is not greedy: seeds give different answers."""
        sampling = SamplingParams(temperature=0.0, dynatemp_range=1.5)
        assert len({tuple(answer) for answer in await per_seed(engine, tokenizer, sampling)}) > 1


class TestXtc:
    async def test_probability_one_removes_the_top_choices(self, engine, tokenizer) -> None:
        """XTC at probability 1 drops every token above the threshold but the least likely of them."""
        first = (await tokens(engine, tokenizer, GREEDY, n=1, n_probs=10))[0]
        assert first.logprob is not None
        threshold = 0.15
        above = [t.token_id for t in first.logprob.top if math.exp(t.logprob) >= threshold]
        assert len(above) >= 2
        sampling = SamplingParams(
            temperature=1.0, top_k=1, xtc_probability=1.0, xtc_threshold=threshold, samplers=("xtc", "top_k")
        )
        assert (await ids(engine, tokenizer, sampling, n=1)) == [above[-1]]

    async def test_the_samplers_order_matters(self, engine, tokenizer) -> None:
        """top_k 1 before XTC leaves XTC one token to keep: the greedy choice, not XTC's."""
        greedy = await ids(engine, tokenizer, GREEDY, n=1)
        sampling = SamplingParams(temperature=1.0, top_k=1, xtc_probability=1.0, xtc_threshold=0.15)
        assert await ids(engine, tokenizer, attrs.evolve(sampling, samplers=("top_k", "xtc")), n=1) == greedy
        assert await ids(engine, tokenizer, attrs.evolve(sampling, samplers=("xtc", "top_k")), n=1) != greedy


class TestMirostat:
    @pytest.mark.parametrize("version", [1, 2])
    async def test_a_low_target_surprise_samples_the_likeliest(self, engine, tokenizer, version) -> None:
        """Mirostat with a target surprise near 0 keeps only the top token, whatever the seed."""
        greedy = await ids(engine, tokenizer, GREEDY)
        sampling = attrs.evolve(UNFILTERED, mirostat=version, mirostat_tau=0.01)
        assert await per_seed(engine, tokenizer, sampling) == [greedy] * 3

    async def test_it_replaces_the_other_stages(self, engine, tokenizer) -> None:
        """With Mirostat on, top_k 1 no longer makes the answer greedy (llama.cpp drops the stages)."""
        greedy = await ids(engine, tokenizer, GREEDY)
        assert await ids(engine, tokenizer, attrs.evolve(UNFILTERED, top_k=1, seed=1)) == greedy
        sampling = attrs.evolve(UNFILTERED, top_k=1, mirostat=2, mirostat_tau=10.0)
        assert any(answer != greedy for answer in await per_seed(engine, tokenizer, sampling))


class TestDry:
    async def test_dry_breaks_the_repetition_of_a_repetitive_prompt(self, engine, tokenizer) -> None:
        """Greedy decoding repeats the prompt's sentence; DRY penalises extending repeats, so far fewer of the
        tokens it generates continue an n-gram seen before."""
        context = tokenizer.encode(REPETITIVE)
        plain = await ids(engine, tokenizer, GREEDY, text=REPETITIVE, n=30)
        dry = await ids(engine, tokenizer, attrs.evolve(GREEDY, dry_multiplier=0.8), text=REPETITIVE, n=30)
        assert repeated_ngrams(context, plain) >= 25
        assert repeated_ngrams(context, dry) <= repeated_ngrams(context, plain) // 2

    async def test_a_dry_penalty_window_of_zero_is_off(self, engine, tokenizer) -> None:
        """dry_penalty_last_n 0 turns DRY off, as in llama.cpp."""
        plain = await ids(engine, tokenizer, GREEDY, text=REPETITIVE)
        off = attrs.evolve(GREEDY, dry_multiplier=0.8, dry_penalty_last_n=0)
        assert await ids(engine, tokenizer, off, text=REPETITIVE) == plain

    async def test_a_window_beyond_the_context_is_the_context(self, engine, tokenizer) -> None:
        """A window of 2**31 - 1 tokens samples as the whole context does, without asking llama.cpp to
        allocate it (it would take 16 GiB for one DRY stage)."""
        whole = attrs.evolve(GREEDY, dry_multiplier=0.8, dry_penalty_last_n=-1, repeat_penalty=1.1)
        huge = attrs.evolve(whole, dry_penalty_last_n=2**31 - 1, repeat_last_n=2**31 - 1)
        assert await ids(engine, tokenizer, huge, text=REPETITIVE) == await ids(
            engine, tokenizer, whole, text=REPETITIVE
        )


def test_a_penalty_window_is_at_most_the_context() -> None:
    """-1 is the context, a longer window is cut to it, a shorter one is kept, 0 stays off."""
    assert [look_back(n, 512) for n in (-1, 2**31 - 1, 64, 0)] == [512, 512, 64, 0]


@pytest.fixture(name="vocab")
def _vocab(model_path: Path) -> Iterator[object]:
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


class TestDryStagesAtShutdown:
    """Closing the engine while a request's worker builds a DRY stage: a clear error, never a freed model."""

    KEY = (0.8, 1.75, 2, 64, ("\n",))

    def test_close_waits_for_a_build_in_flight_and_later_builds_fail(self, vocab) -> None:
        started, release = threading.Event(), threading.Event()

        def slow_build(vocab: object, key: DryKey) -> object:
            started.set()
            release.wait()
            return new_dry_stage(vocab, key)

        stages = DryStages(vocab, build=slow_build)
        errors: list[BaseException] = []

        def prepare() -> None:
            try:
                stages.prepare(self.KEY)
            except EngineFailure as error:
                errors.append(error)

        builder = threading.Thread(target=prepare)
        builder.start()
        assert started.wait(30)
        closer = threading.Thread(target=stages.close)
        closer.start()
        closer.join(0.5)
        assert closer.is_alive()  # the model would be freed under the build
        release.set()
        closer.join(30)
        builder.join(30)
        assert not closer.is_alive()
        assert [str(error) for error in errors] == ["the engine is closed; its DRY stages cannot be built"]
        for late in (stages.prepare, stages.clone):
            with pytest.raises(EngineFailure, match="closed"):
                late(self.KEY)


class TestDryStagesKeepWhatWasPrepared:
    """A request's DRY stage, built on its worker, is still there when the decode thread starts it."""

    def test_a_burst_of_other_settings_does_not_evict_a_fresh_stage(self, vocab) -> None:
        now = [1000.0]
        builds: list[DryKey] = []

        def counted_build(vocab: object, key: DryKey) -> object:
            builds.append(key)
            return new_dry_stage(vocab, key)

        stages = DryStages(vocab, build=counted_build, clock=lambda: now[0])
        mine = (0.8, 1.75, 2, 64, ("\n",))
        stages.prepare(mine)
        for n in range(DryStages.CAPACITY + 4):  # other requests' settings, prepared meanwhile
            stages.prepare((0.8, 1.75, 2, 65 + n, ("\n",)))
        llama_cpp.llama_sampler_free(stages.clone(mine))
        assert builds.count(mine) == 1  # cloned, not built again (on the decode thread)

        now[0] += DryStages.KEEP_PREPARED_S + 1  # long after: the least recently used go again
        for n in range(DryStages.CAPACITY):
            stages.prepare((0.9, 1.75, 2, 64 + n, ("\n",)))
        llama_cpp.llama_sampler_free(stages.clone(mine))
        assert builds.count(mine) == 2
        stages.close()
