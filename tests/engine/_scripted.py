"""Scripted stand-ins for the llama.cpp context, KV sequence and sampler (``bubo.engine._protocols``).

The "model" is a function from the tokens before a position to the token
there, so whatever a generation evaluates (prompt chunks, a token, a draft),
sampling at a batch index gives what that model says: drafting, chunking and
shifting can be checked against a plain generation token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from bubo.domain.generation import CacheReport, CacheTags, GenerationRequest
from bubo.engine._kv_plan import DiskOffer
from bubo.engine._protocols import BatchEntry
from bubo.engine.lora import AdapterSet

Model = Callable[[Sequence[int]], int]
N_VOCAB = 64


@attrs.define(eq=False)
class ScriptedKv:
    """A KV sequence's token mirror; ``cached`` is what ``prepare`` finds reusable."""

    seq_id: int = 0
    tokens: list[int] = attrs.field(factory=list)
    shiftable: bool = True
    shifted: list[tuple[int, int]] = attrs.field(factory=list)
    adapters: AdapterSet = ()
    offers: list[DiskOffer | None] = attrs.field(factory=list)  # what each prepare was handed

    def prepare(
        self,
        prompt: Sequence[int],
        tags: CacheTags | None,
        *,
        reuse: bool = True,
        adapters: AdapterSet = (),
        offer: DiskOffer | None = None,
    ) -> tuple[int, CacheReport]:
        self.offers.append(offer)
        if adapters != self.adapters:
            self.tokens.clear()
        self.adapters = adapters
        keep = 0
        while reuse and keep < min(len(self.tokens), len(prompt) - 1) and self.tokens[keep] == prompt[keep]:
            keep += 1
        del self.tokens[keep:]
        return keep, CacheReport(hit=keep > 0, miss_reason=None if keep else "cold")

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)

    def discard_uncommitted(self) -> None:
        pass

    def truncate(self, keep: int) -> int:
        del self.tokens[keep:]
        return len(self.tokens)

    def can_shift(self) -> bool:
        return self.shiftable

    def shift(self, n_keep: int, n_discard: int) -> int:
        self.shifted.append((n_keep, n_discard))
        del self.tokens[n_keep : n_keep + n_discard]
        return n_discard

    @property
    def private_cells(self) -> int:
        return len(self.tokens)

    def evict(self) -> None:
        self.tokens.clear()

    def clear(self) -> None:
        self.tokens.clear()


@attrs.define(eq=False)
class ScriptedContext:
    """Decodes by recording, at each batch index, the tokens up to and including it."""

    model: Model
    caches: tuple[ScriptedKv, ...] = attrs.field(factory=lambda: (ScriptedKv(),))
    n_ctx_seq: int = 256
    n_ctx_train: int = 4096
    n_batch: int = 64
    n_vocab: int = N_VOCAB
    bos: int | None = None
    ctx: object = None
    batches: list[list[BatchEntry]] = attrs.field(factory=list)
    held: list[int] = attrs.field(factory=list)  # tokens the first entry's sequence held after each decode
    applied: AdapterSet = ()  # the LoRA adapter set in force
    batch_adapters: list[AdapterSet] = attrs.field(factory=list)  # the set in force at each decode
    images: list[BatchEntry] = attrs.field(factory=list)  # every image entry evaluated, in order
    _seen: list[tuple[int, ...]] = attrs.field(factory=list)  # the sequence up to each batch index

    @property
    def n_ctx(self) -> int:
        return self.n_ctx_seq

    def use_adapters(self, adapters: AdapterSet) -> None:
        self.applied = adapters

    def decode_batch(self, entries: Sequence[BatchEntry]) -> list[int]:
        self.batches.append(list(entries))
        self.batch_adapters.append(self.applied)
        self._seen, starts = [], []
        for entry in entries:
            starts.append(len(self._seen))
            before = tuple(entry.cache.tokens)
            for i in range(len(entry.tokens)):
                self._seen.append(before + entry.tokens[: i + 1])
            entry.cache.extend(entry.tokens)
        self.held.append(len(entries[0].cache.tokens))
        return starts

    def decode_image(self, entry: BatchEntry) -> int:
        """An image's positions: recorded in ``images``; the logits after it are the last decode's (-1)."""
        self.images.append(entry)
        self._seen = [(*entry.cache.tokens, *entry.tokens)]
        entry.cache.extend(entry.tokens)
        return -1

    def next_at(self, index: int) -> int:
        """What the model says follows the tokens up to batch index *index*."""
        return self.model(self._seen[index])

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        """The model's token most likely by far, the others by their id (for log-probabilities)."""
        logits = -np.arange(self.n_vocab, dtype=np.float32) / 10
        logits[self.next_at(index)] = 5.0
        return logits


@attrs.define(eq=False)
class ScriptedSampler:
    """Samples what the model says; ``forbidden`` tokens are what a grammar would refuse."""

    context: ScriptedContext
    forbidden: frozenset[int] = frozenset()
    remembered: list[int] = attrs.field(factory=list)
    inserted: list[int] = attrs.field(factory=list)  # tokens accepted without being sampled
    closed: bool = False

    def remember(self, tokens: Sequence[int]) -> None:
        self.remembered.extend(tokens)

    def sample(self, ctx: object, index: int = -1) -> int:
        return self.context.next_at(index)

    def sample_candidates(
        self, ctx: object, index: int, n_vocab: int, n_top: int
    ) -> tuple[int, float, list[tuple[int, float]]]:
        token = self.sample(ctx, index)
        return token, 0.75, [(token, 0.75), ((token + 1) % n_vocab, 0.25)][:n_top]

    def allows(self, token: int) -> bool:
        return token not in self.forbidden

    def accept(self, token: int) -> None:
        self.inserted.append(token)

    def close(self) -> None:
        self.closed = True


def sampler_factory(
    context: ScriptedContext, **fields: object
) -> Callable[[GenerationRequest], ScriptedSampler]:
    """A factory giving every request a :class:`ScriptedSampler`; the last one is ``factory.last``."""

    def make(_request: GenerationRequest) -> ScriptedSampler:
        made = ScriptedSampler(context, **fields)  # type: ignore[arg-type]
        make.last = made  # type: ignore[attr-defined]
        return made

    return make


def pieces() -> list[bytes]:
    """Token *t*'s bytes: a letter, so texts read as the token sequence."""
    return [bytes([ord("a") + t % 26]) for t in range(N_VOCAB)]
