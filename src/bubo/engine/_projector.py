"""A multimodal projector (``--mmproj``): llama.cpp's mtmd context over the loaded text model.

mtmd turns an image into what the text model reads: text tokens it puts
before the image (Gemma 3's ``<start_of_image>``), the image's embeddings
(one per KV position) and text tokens after it.  :meth:`Projector.tokenize`
does the first step, preprocessing the image into a :class:`MediaTokens`;
:meth:`Projector.evaluate` encodes it and decodes its embeddings into a slot's
KV sequence.  Both go through llama.cpp's C API (``llama_cpp.mtmd_cpp``), as the
rest of the engine does.

Threads: ``mtmd_tokenize`` reads the context only (llama.cpp documents it as
thread-safe on a shared context, and llama-server calls it from its HTTP
threads while its main loop encodes), so :meth:`~Projector.tokenize` runs in
request worker threads while the decode thread evaluates.  Encoding writes the
context's one output buffer, so encodes take turns (:meth:`~Projector.encode`,
any thread: the vision tower, an image's costly part, need not hold the decode
thread); decoding the embeddings writes the llama.cpp context, so
:meth:`~Projector.evaluate_encoded` (and :meth:`~Projector.evaluate`, which
encodes then decodes) belongs to the decode thread.  :meth:`~Projector.close`
waits for the tokenizations and the encode under way and refuses later ones.

Refused at load, with a message that says why (never a NULL dereference):

- a projector whose output width is not the model's input embedding width
  (mtmd returns NULL): when the caller passes the width read from the file
  (``bubo.model.read_projector``) the mismatch is named exactly and mtmd is not
  even called; else mtmd's own check refuses it;
- a projector that needs M-RoPE positions (Qwen2-VL and its kind): an image
  there takes fewer KV positions than embeddings, and the engine keeps one
  position per prompt token.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import mtmd_cpp

from bubo.errors import InvalidRequest

from ._images import Bitmap
from ._protocols import ContextFull
from .errors import EngineFailure

__all__ = ["MediaTokens", "Projector", "ProjectorRefused"]

mtmd_logger = logging.getLogger("bubo.llama_cpp.mtmd")

# ggml log levels (1 debug ... 4 error, 5 continuation) -> logging levels; mtmd's INFO chatter goes to DEBUG
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_FATAL_DECODE_STATUS = -2  # llama_decode's compute failures (the context is unusable), as _context's
_NO_KV_SLOT = 1  # llama_decode found no room in the KV cache: the decode loop makes room
_PROBE_SIDE = 1024  # the square image whose token count sizes encoder_bytes (see there)
_F32 = 4


class ProjectorRefused(EngineFailure):
    """The projector cannot serve this model: another model's, unreadable, or a kind Bubo does not drive."""


def _mtmd_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if text:
        mtmd_logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text.decode(errors="replace").rstrip())


# mtmd keeps this pointer for the life of the process: it must never be collected.
_MTMD_LOG_CALLBACK = llama_cpp.llama_log_callback(_mtmd_log)


def _route_mtmd_logs() -> None:
    """Send mtmd's, its helpers' and its CLIP encoder's log lines to Python logging (process-wide)."""
    mtmd_cpp.mtmd_helper_log_set(_MTMD_LOG_CALLBACK, ctypes.c_void_p())


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
    """An mtmd context over the text model: what it takes (``vision``, ``audio``), tokenizing, evaluating."""

    def __init__(self, ctx: int, *, path: Path, n_embd: int) -> None:
        """Use (and own) the mtmd context *ctx* loaded from *path* over a model of input width *n_embd*."""
        self._ctx: int | None = ctx
        self.path = path
        self.n_embd = n_embd
        self.vision: bool = mtmd_cpp.mtmd_support_vision(ctx)
        self.audio: bool = mtmd_cpp.mtmd_support_audio(ctx)
        self._marker: bytes = mtmd_cpp.mtmd_default_marker()
        self._guard = threading.Condition()
        self._tokenizing = 0
        self._encoding = threading.Lock()  # one encode at a time: mtmd has one output buffer
        self._probe_tokens = 0  # set by load: the embeddings of a large image
        # set by load: the embeddings of a large image, where its positions attend to each other (Gemma 3)
        # and it must be decoded in one micro-batch; 0 where the image is causal
        self.one_batch_tokens = 0

    @classmethod
    def load(
        cls,
        path: Path,
        model: object,
        *,
        use_gpu: bool,
        n_threads: int,
        image_min_tokens: int | None,
        image_max_tokens: int | None,
        output_width: int | None = None,
    ) -> Projector:
        """Load the projector at *path* over the llama.cpp *model* (blocking: call from a worker thread).

        *use_gpu*: run the encoder on the GPU backend when there is one
        (``--no-mmproj-offload`` turns it off); *n_threads*: the encoder's CPU
        threads; *image_min_tokens*, *image_max_tokens*: bounds on an image's
        tokens for projectors of dynamic resolution (None: the file's own).
        *output_width*: the projector's output width as read from its file
        (``bubo.model.read_projector``), checked against the model's before
        mtmd sees the file; None leaves the check to mtmd.  mtmd runs one
        warm-up encode of its largest image, so its compute buffer is
        reserved here.

        Raises:
            ProjectorRefused: the projector is another model's, not a projector
                llama.cpp reads, has no vision encoder, or needs M-RoPE positions.

        """
        _route_mtmd_logs()
        n_embd: int = llama_cpp.llama_model_n_embd_inp(model)
        if output_width is not None and output_width != n_embd:
            raise ProjectorRefused(
                f"the projector {path}: its output width {output_width} differs from the model's n_embd "
                f"{n_embd} (a projector made for another model)"
            )
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = True
        params.image_min_tokens = -1 if image_min_tokens is None else image_min_tokens  # -1: the file's
        params.image_max_tokens = -1 if image_max_tokens is None else image_max_tokens
        ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), model, params)
        if not ctx:
            raise ProjectorRefused(
                f"llama.cpp could not load the projector {path} over this model (n_embd {n_embd}); its log "
                f"says why: a file that is no projector, or one made for another model, are the usual causes"
            )
        try:
            return cls._over(ctx, path=path, n_embd=n_embd)
        except BaseException:
            mtmd_cpp.mtmd_free(ctx)
            raise

    @classmethod
    def _over(cls, ctx: int, *, path: Path, n_embd: int) -> Projector:
        """The projector owning the fresh mtmd context *ctx*, sized by a probe image.

        Raises:
            ProjectorRefused: the projector needs M-RoPE positions, or has no vision encoder.

        """
        if mtmd_cpp.mtmd_decode_use_mrope(ctx):
            raise ProjectorRefused(
                f"the projector {path} places images with M-RoPE positions (several embeddings per KV "
                f"position): such models are not supported yet"
            )
        projector = cls(ctx, path=path, n_embd=n_embd)
        if not projector.vision:
            raise ProjectorRefused(
                f"the projector {path} has no vision encoder (an audio projector): Bubo reads images only"
            )
        probe = projector.tokenize(
            Bitmap(_PROBE_SIDE, _PROBE_SIDE, bytes((128,)) * (3 * _PROBE_SIDE * _PROBE_SIDE))
        )
        projector._probe_tokens = probe.n_image
        if mtmd_cpp.mtmd_decode_use_non_causal(ctx, probe._chunks.image):  # noqa: SLF001 (its own handle)
            projector.one_batch_tokens = probe.n_image
        return projector

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

    def evaluate(
        self,
        context: object,
        media: MediaTokens,
        *,
        n_past: int,
        seq_id: int,
        n_batch: int,
        logits_last: bool,
    ) -> int:
        """Encode *media*'s image and decode its embeddings at ``n_past…`` in *seq_id*; the new n_past.

        :meth:`encode`, then :meth:`evaluate_encoded` (see there).  *logits_last*
        is llama.cpp's helper's flag, which it ignores for images: no logits are
        computed at an image's positions, so a prompt's logits come from the
        text after it (``after``), and a True here is refused.

        Raises:
            EngineFailure: the image cannot be evaluated (fatal when llama.cpp's compute failed).

        """
        if logits_last:
            raise EngineFailure("an image's positions have no logits: evaluate the text after it last")
        embeddings = self.encode(media)
        return self.evaluate_encoded(
            context, media, embeddings, n_past=n_past, seq_id=seq_id, n_batch=n_batch
        )

    def evaluate_encoded(
        self,
        context: object,
        media: MediaTokens,
        embeddings: npt.NDArray[np.float32],
        *,
        n_past: int,
        seq_id: int,
        n_batch: int,
    ) -> int:
        """Decode *media*'s *embeddings* (from :meth:`encode`) at ``n_past…`` in *seq_id*; the new n_past.

        Decode thread only: it decodes into the llama.cpp *context* and, for a
        projector whose images attend to each other (Gemma 3:
        ``mtmd_decode_use_non_causal``), turns the context's causal attention
        off for the image and on again after it; the image is then decoded in
        one batch, so it must fit one micro-batch (and the sequence must hold
        nothing at ``n_past`` or after, which the image would see).  Only the
        image is evaluated: ``before`` and ``after`` are ordinary prompt tokens.
        On failure the positions from *n_past* on are removed from *seq_id*, so
        the sequence is as before.

        Raises:
            ContextFull: the KV cache has no room for the image (a ``ContextFull`` is an ``EngineFailure``).
            EngineFailure: the image cannot be decoded (fatal when llama.cpp's compute failed).

        """
        ctx = self._ctx
        if ctx is None:
            raise EngineFailure("the projector was closed")
        n_seq_max = llama_cpp.llama_n_seq_max(context)
        if not 0 <= seq_id < n_seq_max:  # llama.cpp aborts the process on a sequence it does not have
            raise EngineFailure(f"the context has no sequence {seq_id} (it has {n_seq_max})")
        if embeddings.shape != (media.n_image, self.n_embd) or embeddings.dtype != np.float32:
            raise EngineFailure(
                f"the embeddings are {embeddings.dtype} {embeddings.shape}, not the image's "
                f"float32 ({media.n_image}, {self.n_embd})"
            )
        image = media._chunks.image  # noqa: SLF001 (the engine's own handle)
        batch = min(n_batch, llama_cpp.llama_n_batch(context))
        if mtmd_cpp.mtmd_decode_use_non_causal(ctx, image):
            n_ubatch = llama_cpp.llama_n_ubatch(context)
            if media.n_image > n_ubatch:
                raise EngineFailure(
                    f"an image of {media.n_image} embeddings needs a micro-batch of at least that many "
                    f"tokens (--ubatch-size is {n_ubatch}): this projector's image positions attend to each "
                    f"other, so one image is decoded at once"
                )
            batch = max(batch, media.n_image)
        contiguous = np.ascontiguousarray(embeddings)
        new_n_past = llama_cpp.llama_pos(n_past)
        status = mtmd_cpp.mtmd_helper_decode_image_chunk(
            ctx,
            context,
            image,
            contiguous.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            n_past,
            seq_id,
            batch,
            ctypes.byref(new_n_past),
            mtmd_cpp.mtmd_helper_post_decode_callback(),  # NULL: no callback after each sub-batch
            None,
        )
        if status != 0:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(context), seq_id, n_past, -1)
            if status == _NO_KV_SLOT:
                raise ContextFull("the context has no room left for the image")
            raise EngineFailure(
                f"the projector could not decode the image (status {status})",
                fatal=status <= _FATAL_DECODE_STATUS,
            )
        return int(new_n_past.value)

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
