"""What a generation puts into its slot's KV sequence: the prompt in chunks, then room for each token.

The prompt starts after the longest prefix the sequence (or a snapshot) already
holds; the rest is read a chunk at a time, as much as the decode loop gives it
room for in each step's batch.  A generation that reaches the end of its
context stops there, unless the engine shifts the context (llama-server's
``--context-shift``): then, before the token that would not fit is evaluated,
the first ``n_keep`` tokens stay, half of the rest are dropped and the later
cells move down (:meth:`KvSequence.shift`), and the generation goes on.

An image in the prompt is read whole, in a chunk of its own (its embeddings,
encoded by the projector), and never split: a cached prefix that ends inside
an image's positions is cut back to the image's start, a text chunk stops
before it, and a prompt with images is never shifted (an image's cells cannot
be half dropped).
"""

from __future__ import annotations

import attrs

from bubo.domain.generation import CacheReport, GenerationRequest

from ._kv_plan import DiskOffer
from ._protocols import BatchEntry, KvSequence
from .lora import adapter_set

__all__ = ["PromptFeeder"]


class PromptFeeder:
    """One generation's prompt position and its sequence's room (decode thread only)."""

    def __init__(
        self,
        request: GenerationRequest,
        cache: KvSequence,
        *,
        n_ctx: int,
        bos: int | None,
        shift: bool,
        offer: DiskOffer | None = None,
    ) -> None:
        """*n_ctx*: what the sequence may hold; *shift*: go on past it (where the memory can move cells).

        *offer*: the snapshot file read from disk for this request, given to the cache with the prompt.
        """
        self._request = request
        self._offer = offer
        self._prompt = request.prompt_tokens
        self._images = {placed.at: placed for placed in request.images}
        self._cache = cache
        self._n_ctx = n_ctx
        self._bos = bos
        self.shifting = shift and cache.can_shift() and not request.images
        self.at = 0  # the next prompt token to evaluate
        self.n_cached = 0  # prompt tokens the sequence already held
        self.shifts = 0
        self.discarded = 0  # tokens the shifts dropped from the sequence

    def reuse(self) -> CacheReport:
        """Keep the longest cached prefix of the prompt; reading starts after it."""
        request = self._request
        self.n_cached, report = self._cache.prepare(
            self._prompt,
            request.cache_tags,
            reuse=request.cache_prompt,
            adapters=adapter_set(request.lora or ()),
            offer=self._offer,
        )
        self._offer = None  # restored or passed over: its bytes are not kept for the whole generation
        for placed in request.images:
            if placed.at < self.n_cached < placed.end:  # never half an image
                self.n_cached = self._cache.truncate(placed.at)
                report = attrs.evolve(report, shared_tokens=min(report.shared_tokens, self.n_cached))
        self.at = self.n_cached
        return report

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to evaluate."""
        return self.at < len(self._prompt)

    @property
    def left(self) -> int:
        """Prompt tokens still to evaluate."""
        return len(self._prompt) - self.at

    @property
    def processed(self) -> int:
        """Prompt tokens evaluated so far (not counting the cached ones)."""
        return self.at - self.n_cached

    def chunk(self, room: int) -> BatchEntry:
        """Up to *room* prompt tokens for the next batch (logits after the prompt's last).

        An image whose positions start here is the whole chunk, whatever *room*;
        a text chunk ends before the next image.
        """
        placed = self._images.get(self.at)
        if placed is not None:
            chunk = self._prompt[self.at : placed.end]
            return BatchEntry(
                self._cache, chunk, last_logits=placed.end == len(self._prompt), image=placed.image
            )
        end = min(self.at + room, len(self._prompt))
        end = min([end, *(at for at in self._images if self.at < at < end)])
        chunk = self._prompt[self.at : end]
        return BatchEntry(self._cache, chunk, last_logits=end == len(self._prompt))

    @property
    def next_is_image(self) -> bool:
        """Whether the next prompt chunk is an image (read alone, whatever the step's room)."""
        return self.at in self._images

    def read(self, n_tokens: int) -> None:
        """*n_tokens* more of the prompt were evaluated."""
        self.at += n_tokens

    def fits(self, n_generated: int) -> bool:
        """Whether the *n_generated*-th generated token can be evaluated (shifting makes room)."""
        return self.shifting or len(self._prompt) + n_generated < self._n_ctx

    def make_room(self) -> None:
        """Before a token is evaluated: shift the context if it is full (and shifting is on)."""
        if self.shifting and len(self._cache.tokens) + 1 >= self._n_ctx:
            self._shift()

    def _shift(self) -> None:
        """Keep ``n_keep`` tokens (after a BOS), drop half of the rest."""
        prompt, request = self._prompt, self._request
        n_keep = len(prompt) if request.n_keep < 0 else request.n_keep
        if self._bos is not None and prompt[0] == self._bos:
            n_keep += 1
        n_keep = min(self._n_ctx - 4, n_keep)
        n_discard = self._cache.shift(n_keep, (len(self._cache.tokens) - n_keep) // 2)
        self.discarded += n_discard
        self.shifts += 1
