"""What the service holds of a sleeping engine: the embedding model and the image reader across loads.

The service reads ``engine.embedder`` and ``engine.vision`` whenever it pleases
(their facts decide a request's checks before it holds the engine awake), but
the native objects behind them are one load's and go when the model sleeps
(:mod:`._loaded`).  A port keeps the facts of the first load, which every
later load of the same model under the same options repeats, and hands the
work to the current load's object; while the model sleeps it refuses work
with an :class:`EngineFailure` (the service holds the engine awake first, so
only a bug meets it).  The engine attaches each new load's object and
detaches it before freeing it.  A reader that took the previous object just
before it was detached gets the closed object's own refusal, never freed
memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from bubo.domain.media import PromptImage

from .base import EmbeddingModel, EngineFailure, ImageReader

__all__ = ["EmbedderPort", "VisionPort"]


class EmbedderPort:
    """The engine's :class:`~.base.EmbeddingModel`, whichever load's embedding context is current."""

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
        """See :meth:`~.base.EmbeddingModel.embed` (*last_only* is passed on).

        Raises:
            EngineFailure: the model sleeps, or llama.cpp failed.

        """
        current = self._current
        if current is None:
            raise EngineFailure("the embedding context is closed: the model sleeps")
        return current.embed(tokens, last_only=last_only)


class VisionPort:
    """The engine's :class:`~.base.ImageReader`, whichever load's projector is current."""

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
        """See :attr:`~.base.ImageReader.encoder_bytes` (0 while the model sleeps)."""
        current = self._current
        return 0 if current is None else current.encoder_bytes

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """See :meth:`~.base.ImageReader.read_image`.

        Raises:
            InvalidRequest: not a readable image (``param`` names it).
            EngineFailure: the model sleeps, or the projector could not encode the image.

        """
        current = self._current
        if current is None:
            raise EngineFailure("the image projector is closed: the model sleeps")
        return current.read_image(data, param=param)
