"""Images into prompts: Pillow decodes the file, llama.cpp's projector (mtmd) tokenizes the pixels.

:class:`Vision` is the engine's :class:`~.base.ImageReader`.  It runs in the
request workers (decoding and the projector's resizing are CPU work, off the
event loop) and keeps the projector open over the loaded model: the engine
closes it when the model sleeps and opens it over the next one, and a lock
makes a close wait for a read in progress (the service reads images only
while it holds the engine awake, so a read never finds it closed).

An image's embedding positions are written into the prompt as stand-in ids
(:func:`bubo.domain.media.stand_in_ids`).
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

from bubo.domain.media import PromptImage, stand_in_ids

from ._images import decode_image
from ._projector import Projector
from .base import EngineFailure

__all__ = ["Vision"]


class Vision:
    """Image files to :class:`PromptImage` (thread-safe; see the module)."""

    def __init__(
        self,
        path: Path,
        model: object,
        *,
        use_gpu: bool,
        n_threads: int,
        image_min_tokens: int | None,
        image_max_tokens: int | None,
        max_pixels: int,
    ) -> None:
        """Open the projector at *path* over *model*.

        Raises:
            EngineFailure: the projector cannot serve this model (its message says why).

        """
        self._load = functools.partial(
            Projector.load,
            path,
            use_gpu=use_gpu,
            n_threads=n_threads,
            image_min_tokens=image_min_tokens,
            image_max_tokens=image_max_tokens,
        )
        self._max_pixels = max_pixels
        self._lock = threading.Lock()
        self._projector: Projector | None = None
        self.open(model)

    @property
    def max_pixels(self) -> int:
        """The most pixels (width times height) an image may have."""
        return self._max_pixels

    @property
    def encoder_bytes(self) -> int:
        """The working memory encoding one image takes (the projector's estimate; 0 while closed)."""
        projector = self._projector
        return 0 if projector is None else projector.encoder_bytes()

    @property
    def projector(self) -> Projector:
        """The open projector (the decode thread evaluates images with it).

        Raises:
            EngineFailure: it is closed (the model sleeps).

        """
        projector = self._projector
        if projector is None:
            raise EngineFailure("the image projector is closed: the model sleeps")
        return projector

    def open(self, model: object) -> None:
        """Load the projector over *model* (again, after :meth:`close`: the model slept)."""
        projector = self._load(model)
        with self._lock:
            self._projector = projector

    def close(self) -> None:
        """Free the projector, once no read is in progress."""
        with self._lock:
            projector, self._projector = self._projector, None
        if projector is not None:
            projector.close()

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """Decode *data* and tokenize it for the prompt (blocking: a worker thread).

        Raises:
            InvalidRequest: not a readable image, or over :attr:`max_pixels`.
            EngineFailure: the projector is closed.

        """
        bitmap = decode_image(data, param=param, max_pixels=self._max_pixels)
        with self._lock:
            media = self.projector.tokenize(bitmap)
        start = len(media.before)
        return PromptImage(
            tokens=(*media.before, *stand_in_ids(media.digest, media.n_image), *media.after),
            start=start,
            n_positions=media.n_image,
            digest=media.digest.hex(),
            handle=media,
        )
