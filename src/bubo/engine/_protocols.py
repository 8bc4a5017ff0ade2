"""What the decode loop and a generation need from llama.cpp, as Protocols.

:class:`~._context.LlamaContext`, :class:`~._kv.SequenceCache` and
:class:`~._sampler.Sampler` are the real ones; the loop (:mod:`._decode_loop`)
and a generation's parts (:mod:`._generation`, :mod:`._prompt_feeder`,
:mod:`._probabilities`, :mod:`._draft_verifier`) are written against these,
import no native module, and are tested with scripted stand-ins.  A batch entry
is a plain value, defined here; the one failure the loop handles specially,
:class:`~.errors.ContextFull`, is the engine's errors'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt

from bubo.domain.generation import CacheReport, CacheTags, GenerationRequest
from bubo.domain.media import PromptImage

from ._kv_plan import DiskOffer
from .errors import ContextFull
from .lora import NO_ADAPTERS, AdapterSet

__all__ = ["BatchEntry", "ContextFull", "DecodeContext", "KvSequence", "SamplerFactory", "TokenSampler"]


class KvSequence(Protocol):
    """One slot's sequence in the KV cache and the mirror of the tokens it holds (``_kv.SequenceCache``)."""

    @property
    def seq_id(self) -> int:
        """The llama.cpp sequence id (the slot's id)."""
        ...

    @property
    def tokens(self) -> list[int]:
        """The tokens the sequence holds, in order (read-only outside the cache)."""
        ...

    def prepare(
        self,
        prompt: Sequence[int],
        tags: CacheTags | None,
        *,
        reuse: bool = True,
        adapters: AdapterSet = NO_ADAPTERS,
        offer: DiskOffer | None = None,
    ) -> tuple[int, CacheReport]:
        """Keep the longest cached prefix of *prompt* computed under *adapters*; its length and a report.

        *offer*: a snapshot file read for this request, restored if it is still the best source.
        """
        ...

    def extend(self, tokens: Sequence[int]) -> None:
        """Record *tokens* as evaluated after the held ones (the context does, after a decode)."""
        ...

    def discard_uncommitted(self) -> None:
        """Drop what a failed decode may have written past the held tokens."""
        ...

    def truncate(self, keep: int) -> int:
        """Drop everything after the first *keep* tokens; return how many remain."""
        ...

    def can_shift(self) -> bool:
        """Whether cells can move to other positions (a context shift)."""
        ...

    def shift(self, n_keep: int, n_discard: int) -> int:
        """Drop *n_discard* tokens after the first *n_keep*, move the later cells down; how many went.

        More than *n_discard* when a cell to move is shared with another sequence.
        """
        ...

    @property
    def private_cells(self) -> int:
        """Cells no other sequence holds (what evicting this one frees)."""
        ...

    def evict(self) -> None:
        """Give the cells up (keeping a snapshot worth one)."""
        ...

    def park(self) -> None:
        """Idle: give the cells up for a host-RAM snapshot, unless host RAM could not hold one."""
        ...

    def clear(self) -> None:
        """Forget the whole sequence."""
        ...


@attrs.frozen
class BatchEntry:
    """Tokens of one sequence in a batch; logits for every one (a draft to verify) or only the last.

    With ``image``, ``tokens`` are that image's stand-in ids and the entry is
    its embeddings: :meth:`DecodeContext.decode_image` evaluates it alone.
    """

    cache: KvSequence
    tokens: tuple[int, ...]
    all_logits: bool = False
    last_logits: bool = True  # a prompt chunk that does not end the prompt needs none
    image: PromptImage | None = None


class DecodeContext(Protocol):
    """A context with one KV sequence per slot, decoded a batch at a time (``_context.LlamaContext``)."""

    @property
    def ctx(self) -> object:
        """The native context handle samplers read logits from."""
        ...

    @property
    def caches(self) -> Sequence[KvSequence]:
        """Each slot's sequence, by slot id."""
        ...

    @property
    def n_ctx(self) -> int:
        """Tokens the whole context holds (all sequences together)."""
        ...

    @property
    def n_ctx_seq(self) -> int:
        """Tokens one sequence may hold."""
        ...

    @property
    def n_ctx_train(self) -> int:
        """The model's training context."""
        ...

    @property
    def n_batch(self) -> int:
        """The most tokens one decode takes."""
        ...

    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        ...

    @property
    def bos(self) -> int | None:
        """The BOS token the tokenizer adds, or None."""
        ...

    def use_adapters(self, adapters: AdapterSet) -> None:
        """Apply *adapters* (LoRA) to the decodes that follow (nothing to do when they are applied)."""
        ...

    def decode_batch(self, entries: Sequence[BatchEntry]) -> list[int]:
        """Evaluate every entry in one decode; the batch index of each entry's first token.

        Raises:
            ContextFull: no room in the KV cache (the sequences are as before the call).
            EngineFailure: the decode failed (fatal when the context is unusable).

        """
        ...

    def decode_image(self, entry: BatchEntry) -> int:
        """Encode *entry*'s image and evaluate its embeddings after its sequence's tokens; the logits' index.

        Raises:
            ContextFull: no room in the KV cache (the sequence is as before the call).
            EngineFailure: the projector or llama.cpp failed.

        """
        ...

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        """The logits at batch position *index* of the last decode."""
        ...


class TokenSampler(Protocol):
    """One request's sampler chain (``_sampler.Sampler``)."""

    def remember(self, tokens: Sequence[int]) -> None:
        """Show the penalty stages the tokens that came before generation began."""
        ...

    def sample(self, ctx: object, index: int = -1) -> int:
        """Sample (and accept) a token from the logits at batch position *index*."""
        ...

    def sample_candidates(
        self, ctx: object, index: int, n_vocab: int, n_top: int
    ) -> tuple[int, float, list[tuple[int, float]]]:
        """Sample as :meth:`sample` does; also the token's probability after the chain, and the top."""
        ...

    def allows(self, token: int) -> bool:
        """Whether the grammar (if any) admits *token* next."""
        ...

    def accept(self, token: int) -> None:
        """Record a token inserted instead of sampled."""
        ...

    def close(self) -> None:
        """Free the chain."""
        ...


class SamplerFactory(Protocol):
    """Builds a request's sampler chain on the decode thread (``llama.py`` binds the context)."""

    def __call__(self, request: GenerationRequest) -> TokenSampler:
        """The chain for *request*'s sampling settings and grammar.

        Raises:
            EngineFailure: the grammar does not load.

        """
        ...
