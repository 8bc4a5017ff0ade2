"""One llama.cpp context: one KV sequence per slot, batched decoding, logits, tokenizing.

Only the engine's decode thread calls into it (and the start-up probe, before
that thread exists); its :class:`DryStages` alone is thread-safe, for the
request workers that prepare them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from ._cells import CellLedger
from ._disk_cache import DiskTier
from ._dry_stages import DryStages
from ._image_decoder import ImageDecoder
from ._kv import SequenceCache, SnapshotStore
from ._protocols import BatchEntry, ContextFull
from ._vision import EncodedImage
from .errors import EngineFailure
from .lora import NO_ADAPTERS, AdapterSet
from .stats import EngineCounters

__all__ = ["FATAL_DECODE_STATUS", "BatchEntry", "ContextFull", "LlamaContext", "check_decode"]

# llama_decode: 0 ok, 1 no KV slot, 2 aborted, -1 invalid batch, -2 and below compute failures.
FATAL_DECODE_STATUS = -2
_NO_KV_SLOT = 1


class LlamaContext:
    """A context with one sequence per slot, the caches of their tokens, and the totals it feeds.

    The :class:`~._protocols.DecodeContext` the decode loop and the generations use.
    """

    def __init__(
        self,
        model: object,
        params: llama_cpp.llama_context_params,
        *,
        totals: EngineCounters,
        snapshots: SnapshotStore | None,
        reuse_chunk: int = 0,
        adapters: Sequence[Any] = (),
        disk: DiskTier | None = None,
        images: ImageDecoder | None = None,
    ) -> None:
        """*reuse_chunk*: ``--cache-reuse`` (the shortest cached run a sequence moves into place; 0: off).

        *adapters* are the loaded LoRA adapters (``llama_adapter_lora`` pointers), by id; *images*
        decodes the images' embeddings (``--mmproj``'s projector, over the same model).
        """
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise EngineFailure(f"llama.cpp could not create a context of {params.n_ctx} tokens")
        self.ctx = ctx
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_ctx: int = llama_cpp.llama_n_ctx(ctx)
        self.n_ctx_seq: int = llama_cpp.llama_n_ctx_seq(ctx)  # what one sequence may hold
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(model)
        self.bos: int | None = (
            llama_cpp.llama_vocab_bos(self.vocab) if llama_cpp.llama_vocab_get_add_bos(self.vocab) else None
        )
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_batch: int = llama_cpp.llama_n_batch(ctx)
        self.dry = DryStages(self.vocab)
        memory = llama_cpp.llama_get_memory(ctx)
        seq_ids = range(llama_cpp.llama_n_seq_max(ctx))
        self.ledger = CellLedger(seq_ids)
        self.caches = tuple(
            SequenceCache(
                ctx, memory, snapshots, seq_id, ledger=self.ledger, reuse_chunk=reuse_chunk, disk=disk
            )
            for seq_id in seq_ids
        )
        if params.kv_unified:  # one cell may then serve several sequences; separate streams cannot share
            for cache in self.caches:
                cache.peers = self.caches
        self._totals = totals
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._adapters = tuple(adapters)
        self._applied: AdapterSet = NO_ADAPTERS
        self.images = images

    def use_adapters(self, adapters: AdapterSet) -> None:
        """Apply *adapters* to the decodes that follow (``llama_set_adapters_lora``; cheap when unchanged).

        Raises:
            EngineFailure: llama.cpp refused the set (fatal: the context's adapters are then unknown).

        """
        if adapters == self._applied:
            return
        n = len(adapters)
        pointers = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(self._adapters[i] for i, _ in adapters))
        scales = (ctypes.c_float * n)(*(scale for _, scale in adapters))
        if (
            llama_cpp.llama_set_adapters_lora(self.ctx, pointers if n else None, n, scales if n else None)
            != 0
        ):
            raise EngineFailure("llama.cpp could not apply the LoRA adapters", fatal=True)
        self._applied = adapters

    @property
    def cells_used(self) -> int:
        """Cells the sequences hold, a shared one counted once."""
        return self.ledger.used()

    def decode(self, tokens: Sequence[int], seq_id: int = 0) -> None:
        """Evaluate *tokens* after those in sequence *seq_id*, under its adapter set; the last logits only."""
        self.use_adapters(self.caches[seq_id].adapters)
        for start in range(0, len(tokens), self.n_batch):
            self.decode_batch([BatchEntry(self.caches[seq_id], tuple(tokens[start : start + self.n_batch]))])

    def decode_batch(self, entries: Sequence[BatchEntry]) -> list[int]:
        """Evaluate every entry in one ``llama_decode``; the batch index of each entry's first token.

        Raises:
            ContextFull: no room in the KV cache (the sequences are as before the call).
            EngineFailure: llama.cpp failed; fatal for a compute failure (the context is unusable).

        """
        n_tokens = sum(len(entry.tokens) for entry in entries)
        if n_tokens > self.n_batch:  # before writing: the batch's arrays hold n_batch tokens
            raise EngineFailure(f"a batch of {n_tokens} tokens exceeds {self.n_batch}")
        batch = self._batch
        # each read of a ctypes structure's field makes a pointer object: once a step, not once a token
        tokens, positions, seq_ids, logits = batch.token, batch.pos, batch.seq_id, batch.logits
        n_seq_ids = batch.n_seq_id
        starts = []
        i = 0
        for entry in entries:
            starts.append(i)
            seq_id = entry.cache.seq_id
            position = len(entry.cache.tokens)
            last = len(entry.tokens) - 1
            for offset, token in enumerate(entry.tokens):
                tokens[i] = token
                positions[i] = position + offset
                n_seq_ids[i] = 1
                seq_ids[i][0] = seq_id
                logits[i] = entry.all_logits or (entry.last_logits and offset == last)
                i += 1
        batch.n_tokens = i
        status = llama_cpp.llama_decode(self.ctx, batch)
        if status != 0:
            self._failed(status, entries)
        for entry in entries:
            entry.cache.extend(entry.tokens)
        self._totals.decoded(len(entries))
        return starts

    def decode_image(self, entry: BatchEntry) -> int:
        """Evaluate *entry*'s image (encoded already, in a worker) after its sequence's tokens.

        The projector decodes the embeddings in a batch of its own (with the
        attention inside the image the model asks for), so the image is always
        a step's only entry.  No logits come of an image: the prompt's come
        from the text after it, so the index returned is of no use (-1).

        Raises:
            ContextFull: no room in the KV cache (the sequence is as before the call).
            EngineFailure: the projector or llama.cpp failed (the sequence is as before the call;
                fatal when llama.cpp's compute failed).

        """
        image, cache = entry.image, entry.cache
        if image is None or self.images is None:
            raise EngineFailure("an image reached a context without a projector")
        if entry.last_logits:  # the service refuses a prompt that ends with an image; this guards
            raise EngineFailure("an image's positions have no logits: a prompt cannot end with one")
        encoded = image.handle
        if not isinstance(encoded, EncodedImage):
            raise EngineFailure("an image that this engine's projector did not read")
        self.images.evaluate_encoded(
            self.ctx,
            encoded.media,
            encoded.embeddings,
            n_past=len(cache.tokens),
            seq_id=cache.seq_id,
            n_batch=self.n_batch,
        )
        cache.extend(entry.tokens)
        self._totals.decoded(1)
        return -1

    def _failed(self, status: int, entries: Sequence[BatchEntry]) -> None:
        """Raise for a failed ``llama_decode``.

        1 (no room in the KV cache) and -1 (a bad batch) leave the context usable
        once what the batch may have written is dropped; lower values are
        compute failures (a lost device) and are fatal.
        """
        if status <= FATAL_DECODE_STATUS:
            raise EngineFailure(f"llama_decode failed with status {status}", fatal=True)
        for entry in entries:  # a batch split into micro-batches may have left its first part
            entry.cache.discard_uncommitted()
        if status == _NO_KV_SLOT:
            raise ContextFull("the context has no room left for this batch")
        raise EngineFailure(f"llama_decode failed with status {status}")

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        """The logits at batch position *index* of the last decode (-1: the last)."""
        pointer = llama_cpp.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def tokenize(self, text: str) -> tuple[int, ...]:
        """llama.cpp's own tokens for *text* (special markup parsed)."""
        data = text.encode()
        out = (llama_cpp.llama_token * (len(data) + 4))()
        count = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, len(out), False, True)  # noqa: FBT003
        return tuple(out[: max(count, 0)])

    def close(self) -> None:
        """Free the batch, the kept DRY stages and the context."""
        if self.ctx is not None:
            self.dry.close()
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None


def check_decode(context: LlamaContext, batch: int = 64) -> None:
    """Decode a prompt of *batch* tokens, then one more token, and forget them (the start-up probe).

    These are the two shapes of work a server does first (a prefill and a
    decode step), so a kernel that crashes on this CPU crashes here.  Call
    before any request: the decode thread does not run yet.

    Raises:
        EngineFailure: a decode failed or its logits are not finite.

    """
    tokens = context.tokenize("The quick brown fox jumps over the lazy dog. " * batch)[:batch]
    try:
        context.decode(tokens)
        context.decode((int(np.argmax(context.logits(-1))),))
        if not np.isfinite(context.logits(-1)).all():
            raise EngineFailure("the probe decode produced logits that are not finite")
    finally:
        context.caches[0].clear()


def token_piece(vocab: object, token: int) -> bytes:
    """The bytes llama.cpp renders for *token* (``special=false``: control tokens are empty)."""
    buffer = ctypes.create_string_buffer(64)
    size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)  # noqa: FBT003
    if size < 0:
        buffer = ctypes.create_string_buffer(-size)
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)  # noqa: FBT003
    return buffer.raw[:size]
