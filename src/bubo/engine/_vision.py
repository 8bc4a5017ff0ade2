"""Images into prompts: Pillow decodes the file, llama.cpp's projector (mtmd) tokenizes and encodes it.

:class:`Vision` is the engine's :class:`~.base.ImageReader`.  It runs in the
request workers, so everything costly about an image happens off the event
loop and off the decode thread: decoding, the projector's resizing, and the
vision tower's encoding (seconds for a real image on a CPU, which the decode
thread would otherwise spend while every other stream waits).  The decode
thread only decodes the embeddings into the slot's sequence
(:meth:`LlamaContext.decode_image`).

The embeddings of recently read images are kept by the image's digest, up to
:data:`ENCODED_BYTES` (a second turn over the same image then costs neither
the tower nor, when its cells are still cached, a decode).

A :class:`Vision` is one load's: it is freed with the model when the model
sleeps, and the next load makes another (the engine's
:class:`~._ports.VisionPort` stands for whichever is current).  The service
reads images only while it holds the engine awake, so a read never finds it
closed (one that did would fail with an :class:`EngineFailure`, never touch
freed memory: the projector refuses work once closed).  An image's positions
are written into the prompt as stand-in ids (:func:`bubo.domain.media.stand_in_ids`).
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt

from bubo.domain.media import PromptImage, stand_in_ids

from ._images import decode_image
from ._projector import MediaTokens, Projector, ProjectorRefused
from .base import EngineFailure

__all__ = ["ENCODED_BYTES", "EncodedImage", "Vision", "VisionOptions"]

ENCODED_BYTES = 64 * 1024 * 1024
"""The most bytes of embeddings kept for images read again (a real Gemma 3 image's: about 2.6 MB)."""


@attrs.frozen(eq=False)
class EncodedImage:
    """A :class:`PromptImage`'s handle: the tokenized image and its embeddings, ready to decode."""

    media: MediaTokens
    embeddings: npt.NDArray[np.float32]


@attrs.frozen(kw_only=True)
class VisionOptions:
    """The projector and what a request's images may be (``--mmproj`` and the ``--image-*`` flags).

    ``output_width`` is the projector's width as its file says (checked against
    the model's before mtmd reads it; None: mtmd's own check); ``n_ubatch`` the
    context's micro-batch, which must hold a whole image where the image's
    positions attend to each other.
    """

    path: Path
    use_gpu: bool = True
    n_threads: int = 2
    image_min_tokens: int | None = None
    image_max_tokens: int | None = None
    max_pixels: int
    max_images: int
    n_ubatch: int
    output_width: int | None = None


class Vision:
    """Image files to :class:`PromptImage` (thread-safe; see the module)."""

    def __init__(self, options: VisionOptions, model: object) -> None:
        """Open the projector over *model*.

        Raises:
            ProjectorRefused: the projector cannot serve this model (its message says why).

        """
        self._options = options
        self._lock = threading.Lock()  # the projector reference and the kept embeddings
        self._projector: Projector | None = None
        self._encoded: collections.OrderedDict[bytes, npt.NDArray[np.float32]] = collections.OrderedDict()
        self._encoded_bytes = 0
        self._open(model)

    @property
    def max_pixels(self) -> int:
        """The most pixels (width times height) an image may have."""
        return self._options.max_pixels

    @property
    def max_images(self) -> int:
        """The most images one request may hold."""
        return self._options.max_images

    @property
    def encoder_bytes(self) -> int:
        """The working memory encoding one image takes (the projector's estimate; 0 while closed)."""
        projector = self._projector
        return 0 if projector is None else projector.encoder_bytes()

    @property
    def projector(self) -> Projector:
        """The open projector (the decode thread decodes images with it).

        Raises:
            EngineFailure: it is closed (the model sleeps).

        """
        projector = self._projector
        if projector is None:
            raise EngineFailure("the image projector is closed: the model sleeps")
        return projector

    def _open(self, model: object) -> None:
        """Load the projector over *model*, refusing one whose image cannot fit a micro-batch."""
        options = self._options
        projector = Projector.load(
            options.path,
            model,
            use_gpu=options.use_gpu,
            n_threads=options.n_threads,
            image_min_tokens=options.image_min_tokens,
            image_max_tokens=options.image_max_tokens,
            output_width=options.output_width,
        )
        if projector.one_batch_tokens > options.n_ubatch:
            projector.close()
            raise ProjectorRefused(
                f"an image of this projector takes {projector.one_batch_tokens} positions that attend to "
                f"each other, so it is decoded in one micro-batch: start with --ubatch-size "
                f"{projector.one_batch_tokens} or more (it is {options.n_ubatch})"
            )
        with self._lock:
            self._projector = projector

    def close(self) -> None:
        """Free the projector (once the reads under way end) and the kept embeddings; again: nothing."""
        with self._lock:
            projector, self._projector = self._projector, None
            self._encoded.clear()
            self._encoded_bytes = 0
        if projector is not None:
            projector.close()

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """Decode, tokenize and encode the image in *data* for a prompt (blocking: a worker thread).

        Raises:
            InvalidRequest: not a readable image, or over :attr:`max_pixels` (``param`` names it).
            EngineFailure: the projector is closed, or could not encode the image.

        """
        bitmap = decode_image(data, param=param, max_pixels=self._options.max_pixels)
        projector = self.projector
        media = projector.tokenize(bitmap, param=param)
        embeddings = self._kept(media.digest)
        if embeddings is None:
            embeddings = projector.encode(media)
            self._keep(media.digest, embeddings)
        return PromptImage(
            tokens=(*media.before, *stand_in_ids(media.digest, media.n_image), *media.after),
            start=len(media.before),
            n_positions=media.n_image,
            digest=media.digest.hex(),
            handle=EncodedImage(media, embeddings),
        )

    def _kept(self, digest: bytes) -> npt.NDArray[np.float32] | None:
        with self._lock:
            embeddings = self._encoded.get(digest)
            if embeddings is not None:
                self._encoded.move_to_end(digest)
            return embeddings

    def _keep(self, digest: bytes, embeddings: npt.NDArray[np.float32]) -> None:
        """Keep *embeddings* for a later read of the same image, the least recently read going first."""
        if embeddings.nbytes > ENCODED_BYTES:
            return
        with self._lock:
            if self._projector is None or digest in self._encoded:  # closed, or another read kept it
                return
            self._encoded[digest] = embeddings
            self._encoded_bytes += embeddings.nbytes
            while self._encoded_bytes > ENCODED_BYTES:
                _, dropped = self._encoded.popitem(last=False)
                self._encoded_bytes -= dropped.nbytes
