"""The KV cache's data types and ``--cache-reuse`` on the real default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bubo.domain.generation import GenerationRequest
from bubo.engine.llama import LlamaEngine, load_llama_engine
from bubo.model import KvCacheSize, read_metadata
from bubo.tokenizer import HFTokenizer

from .._llama_options import engine_options
from ._generation import GREEDY
from .test_llama import prompt, run

pytestmark = pytest.mark.llama

N_CTX = 1024


def load(model_path: Path, **options: object) -> LlamaEngine:
    return load_llama_engine(
        engine_options(model_path=model_path, n_ctx=N_CTX, n_threads=2, n_parallel=1, **options)
    )


class TestCacheTypes:
    @pytest.mark.parametrize(("type_k", "type_v"), [("q8_0", "q8_0"), ("q4_0", "f16")])
    async def test_llama_cpp_allocates_what_kv_cache_size_says_and_the_model_still_answers(
        self,
        model_path: Path,
        tokenizer: HFTokenizer,
        caplog: pytest.LogCaptureFixture,
        type_k: str,
        type_v: str,
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="bubo.llama_cpp")
        engine = load(model_path, cache_type_k=type_k, cache_type_v=type_v)
        try:
            text, _, _ = await run(
                engine, GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=16, sampling=GREEDY)
            )
            n_cells = engine.statistics().kv_cache_capacity
        finally:
            engine.close()
        assert "Paris" in text
        logged = re.search(
            rf"llama_kv_cache: size = +([\d.]+) MiB .*K \({type_k}\).*V \({type_v}\)", caplog.text
        )
        assert logged is not None, "llama.cpp logs the cache it allocated"
        size = KvCacheSize.of(read_metadata(model_path), type_k=type_k, type_v=type_v, n_ctx=n_cells)
        assert float(logged.group(1)) == round(size.bytes / 2**20, 2)
        assert size.saved_bytes > 0


@pytest.fixture(name="reusing", scope="module")
def _reusing(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load(model_path, cache_reuse=16, cache_ram_mib=0)
    yield engine
    engine.close()


@pytest.fixture(name="cold", scope="module")
def _cold(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load(model_path, cache_ram_mib=0)
    yield engine
    engine.close()


HEAD = "<|im_start|>system\nYou are a careful assistant who answers in one short sentence.<|im_end|>\n"
OLD_TURN = "<|im_start|>user\nRemember the number seven.<|im_end|>\n<|im_start|>assistant\nNoted.<|im_end|>\n"
TAIL = (
    "<|im_start|>user\nHere is a list of rivers: the Seine, the Loire, the Rhone, the Garonne, the "
    "Dordogne, the Marne and the Somme. Which of them flows through Paris?<|im_end|>\n<|im_start|>assistant\n"
)


class TestCacheReuse:
    """A client that drops an old turn from the middle of its history (as agents trim theirs)."""

    async def test_the_tail_after_a_dropped_middle_is_moved_not_evaluated(
        self, reusing: LlamaEngine, tokenizer: HFTokenizer
    ) -> None:
        first = prompt(tokenizer, HEAD + OLD_TURN + TAIL)
        second = prompt(tokenizer, HEAD + TAIL)
        await run(reusing, GenerationRequest(prompt_tokens=first, max_new_tokens=4, sampling=GREEDY))

        _, _, finished = await run(
            reusing, GenerationRequest(prompt_tokens=second, max_new_tokens=4, sampling=GREEDY)
        )

        assert finished.stats.cached_tokens == len(second) - 1  # the head, and the tail moved into place
        assert finished.stats.evaluated_tokens == 1  # the last token, whose logits sampling needs

    async def test_what_the_moved_cells_answer_is_deterministic(
        self, reusing: LlamaEngine, tokenizer: HFTokenizer
    ) -> None:
        """The moved cells were computed with the old turn in view (llama-server's trade, docs/prompt-cache.md).

        So their answer need not be a cold run's (SmolLM2 answers this prompt "The Seine, the Loire"
        warm and "The Loire is the only one" cold), but the same reuse gives the same tokens every time.
        """
        first = prompt(tokenizer, HEAD + OLD_TURN + TAIL)
        second = prompt(tokenizer, HEAD + TAIL)
        answers = []
        for _ in range(2):
            await run(reusing, GenerationRequest(prompt_tokens=first, max_new_tokens=1, sampling=GREEDY))
            _, tokens, finished = await run(
                reusing, GenerationRequest(prompt_tokens=second, max_new_tokens=8, sampling=GREEDY)
            )
            assert finished.stats.evaluated_tokens == 1
            answers.append([t.token_id for t in tokens])
        assert answers[0] == answers[1]

    async def test_without_cache_reuse_only_the_common_prefix_is_kept(
        self, cold: LlamaEngine, tokenizer: HFTokenizer
    ) -> None:
        first = prompt(tokenizer, HEAD + OLD_TURN + TAIL)
        second = prompt(tokenizer, HEAD + TAIL)
        await run(cold, GenerationRequest(prompt_tokens=first, max_new_tokens=1, sampling=GREEDY))
        _, _, finished = await run(
            cold, GenerationRequest(prompt_tokens=second, max_new_tokens=1, sampling=GREEDY)
        )
        assert finished.stats.cached_tokens == len(prompt(tokenizer, HEAD + "<|im_start|>user\n"))

    async def test_runs_shorter_than_the_threshold_are_evaluated_again(
        self, reusing: LlamaEngine, tokenizer: HFTokenizer
    ) -> None:
        short_tail = "<|im_start|>user\nAnd Paris?<|im_end|>\n<|im_start|>assistant\n"  # under 16 tokens
        await run(
            reusing,
            GenerationRequest(
                prompt_tokens=prompt(tokenizer, HEAD + OLD_TURN + short_tail), max_new_tokens=1
            ),
        )
        second = prompt(tokenizer, HEAD + short_tail)
        _, _, finished = await run(reusing, GenerationRequest(prompt_tokens=second, max_new_tokens=1))
        assert finished.stats.cached_tokens == len(prompt(tokenizer, HEAD + "<|im_start|>user\n"))

    async def test_the_moved_cells_serve_the_next_request_as_any_cached_prefix(
        self, reusing: LlamaEngine, tokenizer: HFTokenizer
    ) -> None:
        second = prompt(tokenizer, HEAD + TAIL)
        await run(
            reusing,
            GenerationRequest(prompt_tokens=prompt(tokenizer, HEAD + OLD_TURN + TAIL), max_new_tokens=1),
        )
        await run(reusing, GenerationRequest(prompt_tokens=second, max_new_tokens=1, sampling=GREEDY))
        _, _, again = await run(
            reusing, GenerationRequest(prompt_tokens=second, max_new_tokens=1, sampling=GREEDY)
        )
        assert again.stats.cached_tokens == len(second) - 1
