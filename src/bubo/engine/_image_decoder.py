"""Decoding an image's embeddings into a slot's KV sequence: the decode thread's part of a projector.

The projector (:class:`~._projector.Projector`) tokenizes and encodes an image
in any thread; decoding its embeddings writes the llama.cpp context, so it is
the decode thread's (:meth:`LlamaContext.decode_image`).  Through llama.cpp's
C API (``llama_cpp.mtmd_cpp``): ``mtmd_helper_decode_image_chunk`` decodes
the embeddings in batches of the context's size, or, where the projector's
image positions attend to each other (Gemma 3), in one batch with causal
attention off.  A failed decode leaves the sequence as it was.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import mtmd_cpp

from ._projector import MediaTokens, Projector
from ._protocols import ContextFull
from .errors import EngineFailure

__all__ = ["ImageDecoder"]

_FATAL_DECODE_STATUS = -2  # llama_decode's compute failures (the context is unusable), as _context's
_NO_KV_SLOT = 1  # llama_decode found no room in the KV cache: the decode loop makes room


class ImageDecoder:
    """Decodes images a :class:`Projector` read into a llama.cpp context (decode thread only)."""

    def __init__(self, projector: Projector) -> None:
        self._projector = projector

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

        :meth:`Projector.encode`, then :meth:`evaluate_encoded` (see there).  *logits_last*
        is llama.cpp's helper's flag, which it ignores for images: no logits are
        computed at an image's positions, so a prompt's logits come from the
        text after it (``after``), and a True here is refused.

        Raises:
            EngineFailure: the image cannot be evaluated (fatal when llama.cpp's compute failed).

        """
        if logits_last:
            raise EngineFailure("an image's positions have no logits: evaluate the text after it last")
        embeddings = self._projector.encode(media)
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
        """Decode *media*'s *embeddings* (:meth:`Projector.encode`) at ``n_past…`` in *seq_id*; new n_past.

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
        ctx = self._projector.decoding_context()
        n_seq_max = llama_cpp.llama_n_seq_max(context)
        if not 0 <= seq_id < n_seq_max:  # llama.cpp aborts the process on a sequence it does not have
            raise EngineFailure(f"the context has no sequence {seq_id} (it has {n_seq_max})")
        if embeddings.shape != (media.n_image, self._projector.n_embd) or embeddings.dtype != np.float32:
            raise EngineFailure(
                f"the embeddings are {embeddings.dtype} {embeddings.shape}, not the image's "
                f"float32 ({media.n_image}, {self._projector.n_embd})"
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
