"""The engine's ports: what the service and the API need of it, one Protocol per role.

Code above the engine types what it holds by the narrow port it uses, as an
HTTP client's transport is one method: the idle timer holds a
:class:`Sleeper`, the capability check :class:`ModelFacts`, the slot-file
service :class:`SlotFiles`; :class:`Engine` is every port together, what the
runtime holds.  :class:`EmbeddingModel` and :class:`ImageReader` are the
blocking models a request worker calls.

The service reads ``engine.embedder`` and ``engine.vision`` whenever it pleases
(their facts decide a request's checks before it holds the engine awake), but
the native objects behind them are one load's and go when the model sleeps
(:mod:`._loaded`).  :class:`EmbedderPort` and :class:`VisionPort` keep the
facts of the first load, which every later load of the same model under the
same options repeats, and hand the work to the current load's object; while
the model sleeps they refuse work with an :class:`EngineFailure` (the service
holds the engine awake first, so only a bug meets it).  The engine attaches
each new load's object and detaches it before freeing it.  A reader that took
the previous object just before it was detached gets the closed object's own
refusal, never freed memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import trio

from bubo.domain.generation import EngineEvent, GenerationRequest, GrammarSpec
from bubo.domain.media import PromptImage
from bubo.domain.modes import Pooling
from bubo.domain.sampling import SamplingParams

from .errors import EngineFailure
from .lora import LoraAdapter
from .stats import EngineStatistics
from .values import CacheContents, ModelInfo, PairFormat, SlotFile

__all__ = [
    "EmbedderPort",
    "EmbeddingModel",
    "Engine",
    "Generator",
    "ImageReader",
    "Introspection",
    "Lifecycle",
    "LoraControl",
    "ModelFacts",
    "Sleeper",
    "SlotFiles",
    "VisionPort",
]


class EmbeddingModel(Protocol):
    """Token ids to embeddings, blocking (call from a worker thread); see ``engine/_embedder.py``."""

    @property
    def pooling(self) -> Pooling:
        """llama.cpp's pooling: ``none`` (a vector per token), ``mean``, ``cls``, ``last`` or ``rank``."""
        ...

    @property
    def n_tokens(self) -> int:
        """The most tokens one input may have."""
        ...

    @property
    def n_embd(self) -> int:
        """The length of each vector (a reranker's: its classifier's outputs, ``n_cls_out``)."""
        ...

    @property
    def pair_format(self) -> PairFormat:
        """How a (query, document) pair becomes one input (for ``rank`` pooling)."""
        ...

    def embed(self, tokens: Sequence[int], *, last_only: bool = False) -> npt.NDArray[np.float32]:
        """Shape ``(n_embd,)`` when pooled, ``(len(tokens), n_embd)`` with ``none``.

        *last_only*, with ``none``: only the last token's row, shape ``(n_embd,)`` (the others
        are not computed).
        """
        ...


class ImageReader(Protocol):
    """Image files to prompt input, blocking (call from a worker thread); see ``engine/_vision.py``."""

    @property
    def max_pixels(self) -> int:
        """The most pixels (width times height) an image may have."""
        ...

    @property
    def max_images(self) -> int:
        """The most images one request may hold."""
        ...

    @property
    def encoder_bytes(self) -> int:
        """The working memory encoding one image takes (the memory guard's estimate)."""
        ...

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """Decode *data* (PNG, JPEG, WebP, GIF, BMP) and tokenize it for the prompt.

        Raises:
            InvalidRequest: not a readable image, or over :attr:`max_pixels` (``param`` names it).

        """
        ...


class ModelFacts(Protocol):
    """What the loaded model is and serves besides generation: its facts, embeddings, images."""

    @property
    def info(self) -> ModelInfo:
        """The loaded model."""
        ...

    @property
    def embedder(self) -> EmbeddingModel | None:
        """The embedding model (``--embeddings``), or None when embeddings are not served."""
        ...

    @property
    def vision(self) -> ImageReader | None:
        """What reads images into prompts (``--mmproj``), or None for a model that reads text only."""
        ...


class Generator(Protocol):
    """Generations: the slots' queue and what a request prepares before it joins it."""

    def open_generation(
        self, request: GenerationRequest
    ) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[EngineEvent]]:
        """Wait for the slot, then stream the generation's events.

        Used as ``async with engine.open_generation(req) as events``; the last
        event is always :class:`GenerationFinished` unless the block is left early.
        """
        ...

    @property
    def n_slots(self) -> int:
        """How many session slots there are (cheap, as the next two: for admission and checks)."""
        ...

    @property
    def requests_running(self) -> int:
        """Slots held now (by a generation, or a slot action)."""
        ...

    @property
    def requests_waiting(self) -> int:
        """Requests waiting for a slot."""
        ...

    def compile_grammar(self, spec: GrammarSpec) -> str:
        """The GBNF text a request's grammar becomes (checked: it will load when the request runs).

        Raises:
            GrammarRejected: the spec cannot be converted or parsed.

        """
        ...

    def prepare_sampling(self, sampling: SamplingParams) -> None:
        """Do now, on the calling (worker) thread, the costly part of building *sampling*'s chain."""
        ...


class SlotFiles(Protocol):
    """A slot's KV state to a file and back (``POST /slots/{id}?action=…``)."""

    async def save_slot(self, slot_id: int, path: Path) -> SlotFile:
        """Write idle slot *slot_id*'s KV state and tokens to *path*.

        Raises:
            SlotBusy: a request holds the slot.
            EngineFailure: the file could not be written.

        """
        ...

    async def restore_slot(self, slot_id: int, path: Path) -> SlotFile:
        """Replace idle slot *slot_id*'s KV state with the one saved in *path*.

        Raises:
            SlotBusy: a request holds the slot.
            EngineFailure: the file could not be read (the slot is then empty).

        """
        ...

    async def erase_slot(self, slot_id: int) -> int:
        """Empty idle slot *slot_id*'s KV sequence; return how many tokens it held.

        Raises:
            SlotBusy: a request holds the slot.

        """
        ...


class Sleeper(Protocol):
    """Freeing the model while idle and loading it again (``--sleep-idle-seconds``, ``keep_alive``)."""

    @property
    def can_sleep(self) -> bool:
        """Whether the engine can free its model while idle and load it again (:meth:`sleep`)."""
        ...

    @property
    def sleeping(self) -> bool:
        """Whether the model is freed now (or being freed, or being loaded again)."""
        ...

    @property
    def idle_since(self) -> float | None:
        """The trio time nothing has held the engine since; None while held (or never since the start)."""
        ...

    @property
    def in_use(self) -> bool:
        """Whether something holds the engine awake now (:meth:`awake`)."""
        ...

    def awake(self) -> AbstractAsyncContextManager[None]:
        """Hold the model loaded for a block that touches it, loading it again first if it sleeps.

        Raises (on entry):
            Waking: it is still loading after the wait's bound.

        """
        ...

    async def sleep(self) -> bool:
        """Free the model if nothing holds it; whether it did."""
        ...

    async def wait_activity(self) -> None:
        """Return when a hold of :meth:`awake` ends."""
        ...


class Introspection(Protocol):
    """What the engine reports of its slots and its prompt cache (``/slots``, ``/metrics``, ``/cache``)."""

    def statistics(self) -> EngineStatistics:
        """A consistent-enough snapshot of counters and every slot's state (``/slots``, ``/metrics``)."""
        ...

    def cache_contents(self) -> CacheContents:
        """What the prompt cache holds."""
        ...


class LoraControl(Protocol):
    """The LoRA adapters and their global scales (``/lora-adapters``)."""

    @property
    def lora_adapters(self) -> tuple[LoraAdapter, ...]:
        """The loaded LoRA adapters, by id, with their global scales (``GET /lora-adapters``)."""
        ...

    def set_lora_scales(self, scales: Sequence[float]) -> None:
        """Set every adapter's global scale (one per adapter, by id), for the requests that start later."""
        ...


class Lifecycle(Protocol):
    """The engine's life as the server sees it: drained, interrupted, closed, lost."""

    async def wait_idle(self) -> None:
        """Return once no request runs or waits for a slot."""
        ...

    async def wait_retired(self) -> None:
        """Return once the engine is closed or lost."""
        ...

    @property
    def lost(self) -> bool:
        """Whether a fatal failure left the engine unusable."""
        ...

    async def wait_lost(self) -> None:
        """Return once the engine is lost."""
        ...

    def interrupt(self, error: Exception) -> None:
        """End the running generation and every waiting one with *error*; refuse later ones with it."""
        ...

    async def aclose(self) -> None:
        """Wait until no request runs or waits, then free the model; the engine is unusable afterwards."""
        ...


class Engine(ModelFacts, Generator, SlotFiles, Sleeper, Introspection, LoraControl, Lifecycle, Protocol):
    """Every port together: what the runtime holds (code that needs one role takes that port)."""


class EmbedderPort:
    """The engine's :class:`EmbeddingModel`, whichever load's embedding context is current."""

    def __init__(self, first: EmbeddingModel) -> None:
        """Take the facts of *first*, the first load's, and hand it the work until it is detached."""
        self.pooling = first.pooling
        self.n_tokens = first.n_tokens
        self.n_embd = first.n_embd
        self.pair_format = first.pair_format
        self._current: EmbeddingModel | None = first

    def attach(self, current: EmbeddingModel | None) -> None:
        """Hand the work to *current* (a new load's), or to nobody (None: the model sleeps)."""
        self._current = current

    def embed(self, tokens: Sequence[int], *, last_only: bool = False) -> npt.NDArray[np.float32]:
        """See :meth:`EmbeddingModel.embed` (*last_only* is passed on).

        Raises:
            EngineFailure: the model sleeps, or llama.cpp failed.

        """
        current = self._current
        if current is None:
            raise EngineFailure("the embedding context is closed: the model sleeps")
        return current.embed(tokens, last_only=last_only)


class VisionPort:
    """The engine's :class:`ImageReader`, whichever load's projector is current."""

    def __init__(self, first: ImageReader) -> None:
        """Take the limits of *first*, the first load's, and hand it the work until it is detached."""
        self.max_pixels = first.max_pixels
        self.max_images = first.max_images
        self._current: ImageReader | None = first

    def attach(self, current: ImageReader | None) -> None:
        """Hand the work to *current* (a new load's), or to nobody (None: the model sleeps)."""
        self._current = current

    @property
    def encoder_bytes(self) -> int:
        """See :attr:`ImageReader.encoder_bytes` (0 while the model sleeps)."""
        current = self._current
        return 0 if current is None else current.encoder_bytes

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """See :meth:`ImageReader.read_image`.

        Raises:
            InvalidRequest: not a readable image (``param`` names it).
            EngineFailure: the model sleeps, or the projector could not encode the image.

        """
        current = self._current
        if current is None:
            raise EngineFailure("the image projector is closed: the model sleeps")
        return current.read_image(data, param=param)
