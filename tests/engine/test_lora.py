"""LoRA adapters on the real default model, with a real adapter GGUF the tests write (tests/engine/_lora.py).

Greedy decoding makes every output a fact to compare: scale 0 is the base
model, scale 1 is another model, and each request gets the output of its own
adapter set whatever runs beside it and whatever its slot held before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from bubo.domain.generation import GenerationFinished, GenerationRequest
from bubo.engine.llama import LlamaEngine, LlamaOptions, LoraFile, load_llama_engine
from bubo.model import GGUFError, check_lora_adapter, read_metadata

from ._generation import GREEDY, generate
from ._lora import write_lora

pytestmark = pytest.mark.llama

QUESTION = "<|im_start|>user\nName a red fruit.<|im_end|>\n<|im_start|>assistant\n"
OTHER = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(name="adapter", scope="module")
def _adapter(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    return write_lora(tmp_path_factory.mktemp("lora") / "adapter.gguf", model_path)


def load(
    model_path: Path, *lora: LoraFile, n_parallel: int = 2, cache_idle_slots: bool = True
) -> LlamaEngine:
    return load_llama_engine(
        LlamaOptions(
            model_path=model_path,
            n_ctx=2048,
            n_parallel=n_parallel,
            lora=lora,
            cache_idle_slots=cache_idle_slots,
        )
    )


@pytest.fixture(name="base")
def _base(model_path: Path) -> Iterator[LlamaEngine]:
    engine = load(model_path)
    yield engine
    engine.close()


@pytest.fixture(name="engine")
def _engine(model_path: Path, adapter: Path) -> Iterator[LlamaEngine]:
    """The model with the adapter loaded at global scale 0."""
    engine = load(model_path, LoraFile(adapter, 0.0))
    yield engine
    engine.close()


def prompt_of(engine: LlamaEngine, text: str = QUESTION) -> tuple[int, ...]:
    return engine._current.context.tokenize(text)


async def answer(
    engine: LlamaEngine, lora: tuple[float, ...] | None = None, text: str = QUESTION, max_new: int = 12
) -> tuple[str, GenerationFinished]:
    request = GenerationRequest(
        prompt_tokens=prompt_of(engine, text), max_new_tokens=max_new, sampling=GREEDY, lora=lora
    )
    generated = await generate(engine, request)
    return generated.text, generated.finished


class TestScales:
    async def test_scale_zero_is_the_base_model(self, base, engine) -> None:
        expected, _ = await answer(base)
        assert "fruit" in expected
        assert (await answer(engine))[0] == expected  # the global scale: 0
        assert (await answer(engine, (0.0,)))[0] == expected

    async def test_scale_one_changes_the_answer_the_same_way_each_time(self, base, engine) -> None:
        expected, _ = await answer(base)
        adapted, _ = await answer(engine, (1.0,))
        assert adapted != expected
        assert (await answer(engine, (1.0,)))[0] == adapted
        assert (await answer(engine, (0.5,)))[0] not in (expected, adapted)

    async def test_a_request_scale_overrides_the_global_one(self, base, engine) -> None:
        expected, _ = await answer(base)
        adapted, _ = await answer(engine, (1.0,))
        engine.set_lora_scales([1.0])
        assert engine.lora_adapters[0].scale == 1.0
        assert (await answer(engine))[0] == adapted  # the global scale now applies it
        assert (await answer(engine, (0.0,)))[0] == expected  # the request's own: none
        engine.set_lora_scales([0.0])
        assert (await answer(engine))[0] == expected

    async def test_a_request_loaded_at_scale_applies_it_from_the_start(self, model_path, adapter) -> None:
        engine = load(model_path, LoraFile(adapter, 1.0))
        try:
            alone, _ = await answer(engine)
            assert alone == (await answer(engine, (1.0,)))[0]
        finally:
            engine.close()


class TestTwoAdapterSetsAtOnce:
    async def test_concurrent_requests_each_get_their_own_adapters_output(self, engine) -> None:
        """Two slots, two adapter sets, decoded in alternating steps: each answer is its set's alone."""
        asks = {(1.0,): QUESTION, (0.0,): OTHER}
        alone = {lora: (await answer(engine, lora, text))[0] for lora, text in asks.items()}
        assert alone[(1.0,)] != (await answer(engine, (0.0,), QUESTION))[0]
        together: dict[tuple[float, ...], str] = {}

        async def one(lora: tuple[float, ...]) -> None:
            together[lora] = (await answer(engine, lora, asks[lora]))[0]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, (1.0,))
            nursery.start_soon(one, (0.0,))
        assert together == alone
        statistics = engine.statistics()
        assert statistics.n_busy_slots_per_decode <= 1.0  # never one step for both


class TestThePromptCache:
    async def test_a_prefix_computed_under_other_adapters_is_not_reused(
        self, base, model_path, adapter
    ) -> None:
        engine = load(model_path, LoraFile(adapter, 0.0), n_parallel=1)
        try:
            expected, _ = await answer(base)
            await answer(engine, (1.0,))
            text, finished = await answer(engine, (0.0,))  # same prompt, same slot, other adapters
            assert finished.stats.cached_tokens == 0
            assert text == expected
            _, again = await answer(engine, (0.0,))
            assert again.stats.cached_tokens > 0  # under its own set the prefix is reused
        finally:
            engine.close()

    async def test_a_snapshot_is_restored_only_under_its_own_adapters(self, model_path, adapter) -> None:
        engine = load(model_path, LoraFile(adapter, 0.0), n_parallel=1)
        long_question = "<|im_start|>system\n" + "You answer questions about geography. " * 20 + QUESTION
        try:
            adapted, _ = await answer(engine, (1.0,), long_question)
            await answer(engine, (0.0,), long_question)  # the adapted sequence goes to a snapshot
            text, finished = await answer(engine, (1.0,), long_question)
            assert finished.stats.cache.restored_bytes > 0
            assert text == adapted
        finally:
            engine.close()

    async def test_another_slots_prefix_is_shared_only_under_its_own_adapters(
        self, model_path, adapter
    ) -> None:
        """A cell computed under one adapter set is not another set's prefix, whichever slot holds it.

        Idle slots stay in the cache here (``--no-cache-idle-slots``), so slot 0's cells are there to share.
        """
        engine = load(model_path, LoraFile(adapter, 0.0), n_parallel=2, cache_idle_slots=False)
        long_question = "<|im_start|>system\n" + "You answer questions about mountains. " * 20 + QUESTION
        tokens = prompt_of(engine, long_question)

        async def on_slot(slot: int, lora: tuple[float, ...]) -> GenerationFinished:
            request = GenerationRequest(
                prompt_tokens=tokens, max_new_tokens=4, sampling=GREEDY, lora=lora, slot=slot
            )
            async with engine.open_generation(request) as events:
                async for event in events:
                    if isinstance(event, GenerationFinished):
                        return event
            raise AssertionError("no GenerationFinished")

        try:
            await on_slot(0, (1.0,))
            other = await on_slot(1, (0.0,))
            assert other.stats.cache.shared_tokens == 0
            assert other.stats.cached_tokens == 0
            same = await on_slot(1, (1.0,))  # slot 1's own cells are the other set's; slot 0's are this one's
            assert same.stats.cache.shared_tokens > len(tokens) // 2
        finally:
            engine.close()

    async def test_a_disk_file_is_restored_only_under_its_own_adapters(
        self, model_path, adapter, tmp_path: Path
    ) -> None:
        """The disk tier keeps the set a file was computed under: after a restart, only that set gets it."""
        long_question = "<|im_start|>system\n" + "You answer questions about rivers. " * 20 + QUESTION
        options = LlamaOptions(
            model_path=model_path,
            n_ctx=2048,
            n_parallel=1,
            lora=(LoraFile(adapter, 0.0),),
            cache_disk_dir=tmp_path,
            cache_disk_mib=64,
        )
        engine = load_llama_engine(options)
        try:
            adapted, _ = await answer(engine, (1.0,), long_question)
        finally:
            engine.close()  # the adapted sequence is written to disk
        engine = load_llama_engine(options)
        try:
            _, other = await answer(engine, (0.0,), long_question)
            assert other.stats.cached_tokens == 0  # the file's set is not the request's
            assert other.stats.cache.restored_bytes == 0
            text, finished = await answer(engine, (1.0,), long_question)
            assert finished.stats.cache.restored_bytes > 0
            assert finished.stats.cached_tokens > 0
            assert text == adapted
        finally:
            engine.close()


class TestTheAdapterCheck:
    """Every adapter is read before llama.cpp sees it; one that does not fit is refused with its reason."""

    def test_a_real_adapter_passes(self, adapter, model_path) -> None:
        info = check_lora_adapter(adapter, read_metadata(model_path))
        assert info.n_pairs == 60  # attn_q and attn_v of 30 layers
        assert info.alpha == 8.0

    @pytest.mark.parametrize(
        ("spoil", "message"),
        [
            ({"edit": lambda name, data: data[:, :-1] if name.endswith("lora_a") else data}, "do not fit"),
            ({"edit": lambda name, data: data.T.copy() if name.endswith("lora_b") else data}, "do not fit"),
            ({"edit": lambda name, data: data.astype(np.float64)}, "ggml type"),
            ({"architecture": "qwen2"}, "adapter for 'qwen2'"),
        ],
    )
    def test_one_for_another_model_is_refused(self, tmp_path, model_path, spoil, message) -> None:
        path = write_lora(tmp_path / "bad.gguf", model_path, **spoil)
        with pytest.raises(GGUFError, match=message):
            check_lora_adapter(path, read_metadata(model_path))

    def test_a_truncated_one_is_refused(self, tmp_path, adapter, model_path) -> None:
        path = tmp_path / "cut.gguf"
        path.write_bytes(adapter.read_bytes()[: adapter.stat().st_size // 2])
        with pytest.raises(GGUFError, match="runs past the end"):
            check_lora_adapter(path, read_metadata(model_path))

    def test_the_model_itself_is_not_an_adapter(self, model_path) -> None:
        with pytest.raises(GGUFError, match="is not an adapter"):
            check_lora_adapter(model_path, read_metadata(model_path))
