"""The engine's native resources are freed exactly once on every path.

A ledger wraps llama.cpp's and mtmd's allocation and free functions and keeps
every pointer made and every pointer freed.  A load that fails at each of its
allocations frees what it had made, each once; sleep and wake cycles, a lost
engine and the reload after it free every load's resources once; a record
whose decode thread is stuck frees nothing until the thread stops, then once.
The record and the ports are also tested without a model.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import io
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import pytest
import trio
from llama_cpp import mtmd_cpp
from PIL import Image

from bubo.domain.generation import GenerationFailed, GenerationFinished, GenerationRequest
from bubo.engine import _loaded
from bubo.engine._decode_loop import DecodeLoop
from bubo.engine._ports import EmbedderPort, VisionPort
from bubo.engine.base import EngineFailure
from bubo.engine.fake import FakeEmbedder, FakeVision
from bubo.engine.llama import DraftOptions, LlamaEngine, LlamaOptions, LoraFile, load_llama_engine
from bubo.errors import ServiceUnavailable
from bubo.model import read_projector

from .._tiny_gguf.mmproj import build_mmproj, n_embd_of
from ._generation import GREEDY
from ._lora import write_lora

# the functions that make something llama.cpp or mtmd must free, and what frees it (None: the model does)
ALLOCATIONS = {
    "llama_model_load_from_file": "model",
    "llama_adapter_lora_init": "adapter",
    "llama_init_from_model": "context",
    "mtmd_init_from_file": "mtmd",
}
FREES = {
    "llama_model_free": "model",
    "llama_free": "context",
    "mtmd_free": "mtmd",
    "llama_batch_free": "batch",
}
# the parts of a full load that can fail, in the order it makes them
FAILURE_POINTS = ("model", "adapter", "context", "draft model", "draft context", "projector", "embedder")


def address(pointer: object) -> int | None:
    """The address a native handle holds (the binding returns ints for some, ctypes pointers for others)."""
    if isinstance(pointer, int):
        return pointer
    return ctypes.cast(pointer, ctypes.c_void_p).value  # type: ignore[arg-type]


def batch_key(batch: object) -> int | None:
    return address(batch.token)  # type: ignore[attr-defined]


class NativeLedger:
    """Every native thing made and freed; the allocation numbered ``fail_at`` fails (NULL).

    A free must find its pointer live (made, not yet freed): freeing twice, or
    freeing what was never made, is kept in ``bad_frees``.  An address freed
    may be made again by a later allocation, so liveness, not the address, is
    what is counted.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: collections.Counter[str] = collections.Counter()  # by kind
        self._live: set[tuple[str, int | None]] = set()
        self.bad_frees: list[tuple[str, int | None]] = []
        self.allocations = 0  # allocations that may fail, made or failed
        self.fail_at: int | None = None
        llama_cpp = _loaded.llama_cpp
        for name, kind in ALLOCATIONS.items():
            module = mtmd_cpp if name.startswith("mtmd") else llama_cpp
            monkeypatch.setattr(module, name, self._allocating(getattr(module, name), kind))
        for name, kind in FREES.items():
            module = mtmd_cpp if name.startswith("mtmd") else llama_cpp
            monkeypatch.setattr(module, name, self._freeing(getattr(module, name), kind))
        real_batch_init = llama_cpp.llama_batch_init

        def batch_init(*args: object) -> object:
            batch = real_batch_init(*args)
            self._made("batch", batch_key(batch))
            return batch

        monkeypatch.setattr(llama_cpp, "llama_batch_init", batch_init)

    def _made(self, kind: str, key: int | None) -> None:
        self.made[kind] += 1
        if kind != "adapter":  # llama.cpp frees adapters with their model
            assert (kind, key) not in self._live
            self._live.add((kind, key))

    def _allocating(self, real: Callable[..., object], kind: str) -> Callable[..., object]:
        def allocate(*args: object) -> object:
            self.allocations += 1
            if self.allocations == self.fail_at:
                return None  # what llama.cpp and mtmd return when they cannot make it
            pointer = real(*args)
            if pointer:
                self._made(kind, address(pointer))
            return pointer

        return allocate

    def _freeing(self, real: Callable[..., object], kind: str) -> Callable[..., object]:
        def free(thing: object) -> object:
            key = (kind, batch_key(thing) if kind == "batch" else address(thing))
            if key in self._live:
                self._live.remove(key)
            else:
                self.bad_frees.append(key)
            return real(thing)

        return free

    def live(self) -> list[tuple[str, int | None]]:
        """What was made and not freed yet."""
        return sorted(self._live, key=str)

    def assert_each_freed_once(self) -> None:
        assert self.live() == []
        assert self.bad_frees == []


@pytest.fixture(name="ledger")
def _ledger(monkeypatch: pytest.MonkeyPatch) -> NativeLedger:
    return NativeLedger(monkeypatch)


@pytest.fixture(name="full", scope="module")
def _full(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> LlamaOptions:
    """Options that make every native part: an adapter, a draft model, a projector, embeddings."""
    directory = tmp_path_factory.mktemp("lifecycle")
    mmproj = build_mmproj(directory / "mmproj.gguf", n_embd=n_embd_of(model_path))
    return LlamaOptions(
        model_path=model_path,
        n_ctx=512,
        n_threads=2,
        n_parallel=1,
        embeddings=True,
        lora=(LoraFile(write_lora(directory / "adapter.gguf", model_path), 1.0),),
        draft_model_path=model_path,
        drafting=DraftOptions(draft_max=4),
        mmproj=mmproj,
        mmproj_output_width=read_projector(mmproj).output_width,
    )


def png() -> bytes:
    """A small picture, as a client sends one."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


async def generate(engine: LlamaEngine, prompt: tuple[int, ...] = (1, 2, 3, 4)) -> object:
    request = GenerationRequest(prompt_tokens=prompt, max_new_tokens=4, sampling=GREEDY)
    async with engine.open_generation(request) as events:
        return [event async for event in events][-1]


@pytest.mark.llama
class TestALoad:
    def test_that_succeeds_makes_each_part_and_its_close_frees_each_once(self, full, ledger) -> None:
        """Weights (model and draft), an adapter, three contexts, a projector; close frees each once, twice no more."""
        engine = load_llama_engine(full)
        assert ledger.made == {"model": 2, "adapter": 1, "context": 3, "mtmd": 1, "batch": 3}
        engine.close()
        ledger.assert_each_freed_once()
        engine.close()  # a second close frees nothing again
        ledger.assert_each_freed_once()

    @pytest.mark.parametrize("step", range(1, len(FAILURE_POINTS) + 1), ids=FAILURE_POINTS)
    def test_that_fails_at_a_step_frees_what_it_made_each_once(self, full, ledger, step: int) -> None:
        """A NULL from llama.cpp or mtmd at any of the seven allocations: the load raises, nothing leaks."""
        ledger.fail_at = step
        with pytest.raises(EngineFailure):
            load_llama_engine(full)
        assert ledger.allocations == step  # it stopped at the failure
        assert ledger.made.total() - ledger.made["batch"] == step - 1
        ledger.assert_each_freed_once()

    def test_whose_projector_is_refused_after_it_loaded_frees_it_once(self, full, ledger) -> None:
        """A projector whose image cannot fit a micro-batch is freed with everything made before it."""
        with pytest.raises(EngineFailure, match="ubatch-size"):
            load_llama_engine(attrs.evolve(full, n_ubatch=2))
        assert ledger.made["mtmd"] == 1
        ledger.assert_each_freed_once()


@pytest.mark.llama
class TestSleepAndWake:
    async def test_every_cycle_frees_its_load_once(self, full, ledger) -> None:
        """Each sleep frees everything its load made; each wake loads anew; close frees the last load."""
        engine = load_llama_engine(full)
        try:
            for cycle in range(1, 3):
                assert isinstance(await generate(engine), GenerationFinished)
                assert await engine.sleep() is True
                assert ledger.live() == []  # everything native went: nothing was left for the next load
                assert engine.sleeps == cycle
            assert isinstance(await generate(engine), GenerationFinished)
        finally:
            engine.close()
        assert ledger.made["model"] == 2 * 3  # the model and the draft model, three loads
        ledger.assert_each_freed_once()

    async def test_the_ports_stay_and_serve_each_load(self, full, ledger) -> None:
        """engine.embedder and engine.vision are the same objects across a sleep, refusing work while asleep."""
        engine = load_llama_engine(full)
        try:
            embedder, vision = engine.embedder, engine.vision
            assert embedder is not None
            assert vision is not None
            async with engine.awake():
                before = embedder.embed((1, 2, 3))
                image = vision.read_image(png(), param="image")
            assert await engine.sleep() is True
            with pytest.raises(EngineFailure, match="sleeps"):
                embedder.embed((1, 2, 3))
            with pytest.raises(EngineFailure, match="sleeps"):
                vision.read_image(png(), param="image")
            assert vision.encoder_bytes == 0
            async with engine.awake():
                assert engine.embedder is embedder
                assert engine.vision is vision
                assert np.array_equal(embedder.embed((1, 2, 3)), before)
                assert vision.read_image(png(), param="image").tokens == image.tokens
        finally:
            engine.close()
        ledger.assert_each_freed_once()

    @pytest.mark.parametrize("step", range(1, len(FAILURE_POINTS) + 1), ids=FAILURE_POINTS)
    async def test_a_wake_that_fails_at_a_step_frees_what_it_made_and_loses_the_engine(
        self, full, ledger, step: int
    ) -> None:
        """The wake-up's partial load is freed, the request gets a 503, and the engine is lost."""
        engine = load_llama_engine(full)
        try:
            assert await engine.sleep() is True
            ledger.fail_at = ledger.allocations + step
            with pytest.raises(ServiceUnavailable, match="could not be loaded again"):
                await generate(engine)
            assert engine.lost
            assert ledger.live() == []
        finally:
            engine.close()
        ledger.assert_each_freed_once()


def bug(*_args: object, **_kwargs: object) -> None:
    raise KeyError("a bug on the decode thread")


@pytest.mark.llama
class TestALostEngine:
    async def test_is_freed_once_on_close_and_the_reload_after_it_too(
        self, full, ledger, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The decode loop's guard loses the engine; device recovery closes it and loads another."""
        engine = load_llama_engine(full)
        with monkeypatch.context() as patched:
            patched.setattr(DecodeLoop, "_admit", bug)
            assert isinstance(await generate(engine), GenerationFailed)
        with trio.fail_after(60):
            await engine.wait_lost()
        await engine.aclose()
        ledger.assert_each_freed_once()
        again = load_llama_engine(full)
        try:
            assert isinstance(await generate(again), GenerationFinished)
        finally:
            again.close()
        ledger.assert_each_freed_once()


class StoppingLoop:
    """A decode loop whose thread is stuck until told otherwise."""

    def __init__(self) -> None:
        self.stuck = True

    def stop(self, timeout_s: float | None = None) -> bool:
        return not self.stuck


class TestTheRecord:
    def test_frees_nothing_while_its_thread_is_stuck_then_everything_once(self) -> None:
        """A stuck decode thread keeps everything allocated; once it stops, one close frees each part once."""
        freed: list[str] = []
        loop = StoppingLoop()
        with contextlib.ExitStack() as stack:
            stack.callback(freed.append, "model")
            stack.callback(freed.append, "context")
            record = _loaded.LoadedModel(
                model=object(),
                context=None,
                draft=None,
                vision=None,
                embedder=None,
                loop=loop,
                setup=None,
                resources=stack.pop_all(),
            )
        assert record.close(0.0) is False
        assert record.close(0.0) is False
        assert freed == []
        loop.stuck = False
        assert record.close(0.0) is True
        assert record.close(0.0) is True
        assert freed == ["context", "model"]  # in reverse order of making, each once


class TestThePorts:
    def test_keep_the_first_loads_facts_and_refuse_work_while_detached(self) -> None:
        """The embedder port answers pooling and sizes while asleep, and embeds through the attached load."""
        first = FakeEmbedder(pooling="last", n_tokens=16, n_embd=8)
        port = EmbedderPort(first)
        vector = port.embed((1, 2))
        port.attach(None)
        assert (port.pooling, port.n_tokens, port.n_embd) == ("last", 16, 8)
        with pytest.raises(EngineFailure, match="sleeps"):
            port.embed((1, 2))
        port.attach(FakeEmbedder(pooling="last", n_tokens=16, n_embd=8))
        assert np.array_equal(port.embed((1, 2)), vector)
        assert first.inputs == [(1, 2)]

    def test_of_embeddings_passes_on_a_request_for_the_last_tokens_row_alone(self) -> None:
        """A generative model's Ollama-style embedding asks the port for the last token's row, as the service does."""
        port = EmbedderPort(FakeEmbedder(pooling="none", n_tokens=16, n_embd=8))
        rows = port.embed((1, 2, 3))
        last = port.embed((1, 2, 3), last_only=True)
        assert (rows.shape, last.shape) == ((3, 8), (8,))
        assert np.array_equal(last, rows[-1])

    def test_of_vision_report_no_encoder_while_detached(self) -> None:
        """The vision port keeps its limits, reserves no encoder memory and reads nothing while asleep."""
        port = VisionPort(FakeVision(encoder_bytes=1024, max_images=3))
        assert (port.encoder_bytes, port.max_images) == (1024, 3)
        port.attach(None)
        assert (port.encoder_bytes, port.max_images) == (0, 3)
        with pytest.raises(EngineFailure, match="sleeps"):
            port.read_image(b"", param="image")
