"""A multimodal projector (``--mmproj``): llama.cpp's mtmd context over the loaded text model.

mtmd turns an image into what the text model reads: text tokens it puts
before the image (Gemma 3's ``<start_of_image>``), the image's embeddings
(one per KV position) and text tokens after it.  :meth:`Projector.tokenize`
does the first step, preprocessing the image into a :class:`MediaTokens`;
:meth:`Projector.encode` runs it through the vision tower; an
:class:`~._image_decoder.ImageDecoder` decodes the embeddings into a slot's
KV sequence.  All go through llama.cpp's C API (``llama_cpp.mtmd_cpp``), as
the rest of the engine does; :func:`~._projector_load.load_projector` loads
the file and refuses what Bubo cannot drive.

Threads: ``mtmd_tokenize`` reads the context only (llama.cpp documents it as
thread-safe on a shared context, and llama-server calls it from its HTTP
threads while its main loop encodes), so :meth:`~Projector.tokenize` runs in
request worker threads while the decode thread evaluates.  Encoding writes the
context's one output buffer, so encodes take turns (:meth:`~Projector.encode`,
any thread: the vision tower, an image's costly part, need not hold the decode
thread); decoding the embeddings writes the llama.cpp context, so it belongs
to the decode thread (:meth:`~Projector.decoding_context`).
:meth:`~Projector.close` waits for the tokenizations and the encode under way
and refuses later ones.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
from llama_cpp import mtmd_cpp

from bubo.errors import InvalidRequest

from ._images import Bitmap
from .errors import EngineFailure

__all__ = ["MediaTokens", "Projector", "ProjectorRefused"]

_PROBE_SIDE = 1024  # the square image whose token count sizes encoder_bytes (see there)
_F32 = 4


class ProjectorRefused(EngineFailure):
    """The projector cannot serve this model: another model's, unreadable, or a kind Bubo does not drive."""


class _OwnedChunks:
    """The native ``mtmd_input_chunks`` of one tokenized image, freed when nothing refers to it any more.

    The chunks hold the preprocessed image (its float pixels at the encoder's
    input size), so a :class:`MediaTokens` kept for a later turn keeps them.
    They do not depend on the mtmd context and may outlive it.
    """

    __slots__ = ("__weakref__", "image", "pointer")

    def __init__(self, pointer: int, image_index: int) -> None:
        self.pointer = pointer
        self.image: int = mtmd_cpp.mtmd_input_chunks_get(pointer, image_index)
        weakref.finalize(self, mtmd_cpp.mtmd_input_chunks_free, pointer)


@attrs.frozen(eq=False)
class MediaTokens:
    """An image as the prompt reads it: text tokens mtmd puts before it, its embedding positions, text after.

    ``n_image`` embeddings take ``n_image`` consecutive KV positions (a
    projector where they would not is refused at load).  ``digest`` is the
    decoded bitmap's SHA-256 (:meth:`Bitmap.digest`): the same picture sent
    again, in any file format, has the same digest, so a prompt cache may key
    the image's cells by it.  Equality is identity: two tokenizations of one
    image are two native objects.
    """

    before: tuple[int, ...]
    n_image: int
    after: tuple[int, ...]
    digest: bytes
    _chunks: _OwnedChunks = attrs.field(repr=False)


class Projector:
    """An mtmd context over the text model: what it takes (``vision``, ``audio``), tokenizing, encoding."""

    def __init__(self, ctx: int, *, path: Path, n_embd: int) -> None:
        """Use (and own) the mtmd context *ctx* loaded from *path* over a model of input width *n_embd*.

        A probe image sizes it (:meth:`encoder_bytes`, :attr:`one_batch_tokens`):
        *ctx* must have a vision encoder (:func:`~._projector_load.load_projector` checks).
        """
        self._ctx: int | None = ctx
        self.path = path
        self.n_embd = n_embd
        self.vision: bool = mtmd_cpp.mtmd_support_vision(ctx)
        self.audio: bool = mtmd_cpp.mtmd_support_audio(ctx)
        self._marker: bytes = mtmd_cpp.mtmd_default_marker()
        self._guard = threading.Condition()
        self._tokenizing = 0
        self._encoding = threading.Lock()  # one encode at a time: mtmd has one output buffer
        probe = self.tokenize(
            Bitmap(_PROBE_SIDE, _PROBE_SIDE, bytes((128,)) * (3 * _PROBE_SIDE * _PROBE_SIDE))
        )
        self._probe_tokens = probe.n_image  # the embeddings of a large image
        # where an image's positions attend to each other (Gemma 3) it is decoded in one micro-batch, which
        # must hold this many (0: the image is causal)
        one_batch = mtmd_cpp.mtmd_decode_use_non_causal(ctx, probe._chunks.image)  # noqa: SLF001 (its own)
        self.one_batch_tokens = probe.n_image if one_batch else 0

    def tokenize(self, bitmap: Bitmap, *, param: str | None = None) -> MediaTokens:
        """*bitmap* as the prompt reads it (thread-safe; blocking: the image is preprocessed here).

        *param*: the request field the image came from, for the 400.

        Raises:
            InvalidRequest: the projector takes no images, or mtmd could not preprocess this one.
            EngineFailure: the projector was closed, or mtmd's chunks are not one image between texts.

        """
        if not self.vision:
            raise InvalidRequest("this model's projector takes no images", param=param)
        digest = bitmap.digest()
        pixels = (ctypes.c_uint8 * len(bitmap.rgb)).from_buffer_copy(bitmap.rgb)
        with self._guard:
            if self._ctx is None:
                raise EngineFailure("the projector was closed")
            ctx = self._ctx
            self._tokenizing += 1
        try:
            native = mtmd_cpp.mtmd_bitmap_init(bitmap.width, bitmap.height, pixels)
            if not native:
                raise EngineFailure("mtmd could not allocate the image's bitmap")
            chunks = mtmd_cpp.mtmd_input_chunks_init()
            try:
                mtmd_cpp.mtmd_bitmap_set_id(native, digest.hex().encode())  # names the image in mtmd's chunks
                text = mtmd_cpp.mtmd_input_text(
                    text=self._marker, text_len=len(self._marker), add_special=False, parse_special=True
                )
                status = mtmd_cpp.mtmd_tokenize(
                    ctx, chunks, ctypes.byref(text), (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(native), 1
                )
            finally:
                mtmd_cpp.mtmd_bitmap_free(native)
            return self._media(chunks, status, bitmap, digest, param)
        finally:
            with self._guard:
                self._tokenizing -= 1
                self._guard.notify_all()

    def _media(
        self, chunks: int, status: int, bitmap: Bitmap, digest: bytes, param: str | None
    ) -> MediaTokens:
        """The :class:`MediaTokens` of mtmd's *chunks* (which it then owns), or the error *status* says."""
        try:
            return _read_chunks(chunks, status, bitmap, digest, param)
        except BaseException:
            mtmd_cpp.mtmd_input_chunks_free(chunks)
            raise

    def encode(self, media: MediaTokens) -> npt.NDArray[np.float32]:
        """*media*'s image through the vision tower: its ``(n_image, n_embd)`` embeddings (blocking).

        Any thread: encodes take turns (mtmd writes one output buffer, copied
        here before the next may start), so a worker thread may encode while
        the decode thread decodes the other requests' tokens; the tower is the
        costly part of an image (seconds for a real one on a CPU).

        Raises:
            EngineFailure: the projector was closed, or mtmd could not encode the image.

        """
        with self._encoding:  # close() frees the context only while holding it
            ctx = self._ctx
            if ctx is None:
                raise EngineFailure("the projector was closed")
            status = mtmd_cpp.mtmd_encode_chunk(ctx, media._chunks.image)  # noqa: SLF001 (the engine's handle)
            if status != 0:
                raise EngineFailure(f"the projector could not encode the image (mtmd status {status})")
            output = mtmd_cpp.mtmd_get_output_embd(ctx)
            return np.ctypeslib.as_array(output, shape=(media.n_image, self.n_embd)).copy()

    def decoding_context(self) -> int:
        """The mtmd context, for decoding an image's embeddings on the decode thread (:mod:`._image_decoder`).

        Unguarded: :meth:`close` is called only once the decode thread stopped.

        Raises:
            EngineFailure: the projector was closed.

        """
        ctx = self._ctx
        if ctx is None:
            raise EngineFailure("the projector was closed")
        return ctx

    def encoder_bytes(self) -> int:
        """Memory one image's evaluation needs beyond what the projector reserved at load (an estimate).

        mtmd reserves its encoder's compute buffer at load, for its largest
        image (the warm-up encode), so that is the load's, not an image's.  An
        image then needs its output embeddings three times over, ``n_image *
        n_embd`` floats each: mtmd's output buffer, the copy :meth:`encode`
        returns, and llama.cpp's input tensor for the decode.  ``n_image`` is
        that of a 1024x1024 probe image tokenized at load: every image of a
        fixed-resolution projector (Gemma 3) has as many; a dynamic one gives
        about a megapixel's (within its ``image_max_tokens``).  Not counted:
        the preprocessed image a :class:`MediaTokens` holds until dropped (the
        encoder's input size, ``3 * side * side`` floats).
        """
        return 3 * self._probe_tokens * self.n_embd * _F32

    def close(self) -> None:
        """Free the mtmd context once the tokenizations and the encode under way end; later ones are refused.

        Call it after the decode thread stopped (nothing waits for an
        evaluation).  The :class:`MediaTokens` made meanwhile stay valid to free.
        """
        with self._guard:
            ctx, self._ctx = self._ctx, None
            self._guard.wait_for(lambda: self._tokenizing == 0)
        with self._encoding:
            if ctx is not None:
                mtmd_cpp.mtmd_free(ctx)


def _read_chunks(chunks: int, status: int, bitmap: Bitmap, digest: bytes, param: str | None) -> MediaTokens:
    """The :class:`MediaTokens` (owning them) of mtmd's *chunks* for *bitmap*, or the error *status* says.

    Raises:
        InvalidRequest: mtmd could not preprocess the image (status 2; 1, a marker count, cannot happen).
        EngineFailure: the chunks are not one image between texts, one KV position per embedding.

    """
    if status != 0:
        raise InvalidRequest(
            f"the projector could not preprocess this {bitmap.width}x{bitmap.height} image "
            f"(mtmd status {status})",
            param=param,
        )
    texts: list[list[int]] = [[]]
    images: list[int] = []
    for index in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
        chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, index)
        if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT:
            texts[-1].extend(_text_tokens(chunk))
        else:
            images.append(index)
            texts.append([])
    if len(images) != 1:
        raise EngineFailure(f"mtmd made {len(images)} media chunks of one image")
    image = mtmd_cpp.mtmd_input_chunks_get(chunks, images[0])
    n_tokens: int = mtmd_cpp.mtmd_input_chunk_get_n_tokens(image)
    if mtmd_cpp.mtmd_input_chunk_get_n_pos(image) != n_tokens:
        raise EngineFailure("the image's embeddings do not take one KV position each")
    return MediaTokens(
        before=tuple(texts[0]),
        n_image=n_tokens,
        after=tuple(texts[1]),
        digest=digest,
        chunks=_OwnedChunks(chunks, images[0]),
    )


def _text_tokens(chunk: int) -> list[int]:
    """The token ids of a text chunk."""
    count = ctypes.c_size_t()
    tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
    return [tokens[i] for i in range(count.value)]
