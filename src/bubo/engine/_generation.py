"""One request's generation on the decode thread, composed of one part per concern.

The decode loop (:mod:`._decode_loop`) asks every active generation for its
part of the next batch (a chunk of prompt while prefilling, the last sampled
token while generating), evaluates all parts in one decode, then hands each
generation the batch index of its part, where its logits are.  The generation
samples the next token there and reports facts to its slot; the rest is its
parts':

- :class:`PromptFeeder`: the prompt's position (after the cached prefix) and
  the sequence's room, shifting the context where allowed;
- :class:`EndPolicy`: when the generation ends and why, the text each token
  releases, and when the end of thinking is inserted;
- :class:`ProbabilityRecorder`: each token's log-probabilities, if asked for;
- :class:`TokenTakes`: each sampled token's take (the slot's count, the end
  policy's verdict, its event with its log-probabilities, the draft source's
  history), at once or beside the next decode, and the tokens a verdict asks
  to insert instead of the next sampled ones;
- :class:`Drafting`: its :class:`DraftSource` (a draft model's
  :class:`ModelDrafts` when the engine has one, else prompt lookup's), drafts
  to verify while the generation is alone in the batch, within the request's
  ``speculative`` limits, and the :class:`DraftVerifier`'s walk over them;
- :class:`GenerationReport`: the prompt's progress, the timings its slot
  keeps, and the last event with the request's statistics.

With ``EngineSetup.defer_takes`` (and no draft model, whose proposal as the
next batch is planned would delay the token's event) a token whose verdict can
wait is evaluated next before it is taken, and :meth:`Generation.settle` takes
it beside the next ``llama_decode``, before the generation samples again.  A
stop string found then ends the generation with its last token, and any draft
after it, already in the KV cache (they are the cells of those tokens, which a
later prompt may reuse as far as it matches).  Written against the
:mod:`._protocols`, so it runs with a scripted context and sampler.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from bubo.domain.generation import EngineEvent, GenerationRequest, StopCause

from ._draft_policy import DraftPolicy
from ._drafting import Drafting
from ._end_policy import EndPolicy
from ._generation_report import GenerationReport, Outcome
from ._kv_plan import DiskOffer
from ._model_drafts import Drafter
from ._probabilities import ProbabilityRecorder
from ._prompt_feeder import PromptFeeder
from ._protocols import BatchEntry, DecodeContext, KvSequence, SamplerFactory, TokenSampler
from ._token_takes import TokenTakes
from .errors import EngineFailure
from .lora import AdapterSet, adapter_set
from .slots import Slot

__all__ = ["EngineSetup", "Generation", "Outcome"]


@attrs.frozen(kw_only=True)
class EngineSetup:
    """What an engine gives each of its generations: the context, the model's facts, its policies."""

    context: DecodeContext
    pieces: list[bytes]  # each token's bytes
    eog: frozenset[int]  # the end-of-generation tokens
    sampler: SamplerFactory
    drafting: DraftPolicy | None = None  # drafting statistics, shared by the engine's generations
    drafter: Drafter | None = None  # the draft model (its policy is ``drafting``); None: prompt lookup
    context_shift: bool = False  # go on past the end of the context (llama-server's --context-shift)
    defer_takes: bool = False  # a token whose verdict can wait is taken beside the next decode


class Generation:
    """The state of one request's generation in its slot's KV sequence (decode thread only)."""

    def __init__(
        self,
        setup: EngineSetup,
        slot: Slot,
        request: GenerationRequest,
        *,
        emit: Callable[[EngineEvent], None],
        offer: DiskOffer | None = None,
    ) -> None:
        """*emit* reports to the trio thread; *offer*: the disk file read for this request, its alone."""
        context = setup.context
        self.request = request
        self.slot = slot
        self.cache: KvSequence = context.caches[slot.id]
        self.cancelled = False  # set on the trio thread; the loop drops the generation at its next step
        self.outcome: Outcome | None = None
        self._context = context
        self._make_sampler = setup.sampler
        self._sampler: TokenSampler | None = None
        self._feeder = PromptFeeder(
            request,
            self.cache,
            n_ctx=context.n_ctx_seq,
            bos=context.bos,
            shift=setup.context_shift,
            offer=offer,
        )
        self._ending = EndPolicy(
            request,
            eog=setup.eog,
            n_ctx_train=context.n_ctx_train,
            fits=self._feeder.fits,
            shifts=setup.context_shift and not request.images,
        )
        self._probabilities = ProbabilityRecorder(request, context, setup.pieces)
        self._drafting = Drafting(request, slot, context, policy=setup.drafting, drafter=setup.drafter)
        self._takes = TokenTakes(
            slot=slot,
            ending=self._ending,
            probabilities=self._probabilities,
            drafting=self._drafting,
            pieces=setup.pieces,
            emit=emit,
            defer=setup.defer_takes and setup.drafter is None,
        )
        self._token: int | None = None  # sampled (and taken, unless its take waits), not yet evaluated
        self._report = GenerationReport(
            request=request,
            slot=slot,
            feeder=self._feeder,
            ending=self._ending,
            verifier=self._drafting.verifier,
            emit=emit,
        )
        self._adapters = adapter_set(request.lora or ())

    # ---- what the loop asks ------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether the generation ended (its outcome is set)."""
        return self.outcome is not None

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to evaluate."""
        return self._feeder.prefilling

    @property
    def adapters(self) -> AdapterSet:
        """The LoRA adapter set the generation decodes under."""
        return self._adapters

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to evaluate."""
        return self._feeder.left

    @property
    def unsettled(self) -> bool:
        """Whether the last sampled token's take waits (:meth:`settle`, before the next sampling)."""
        return self._takes.waiting

    def start(self) -> None:
        """Reuse the slot's cached prefix of the prompt (or a snapshot's) and build the sampler.

        Raises:
            EngineFailure: the prompt does not fit the context, or the grammar does not load.

        """
        request, context = self.request, self._context
        prompt = request.prompt_tokens
        if not prompt or len(prompt) >= context.n_ctx_seq:  # the service checks first; this guards
            msg = f"prompt of {len(prompt)} tokens cannot be evaluated in a {context.n_ctx_seq}-token context"
            raise EngineFailure(msg)
        self._report.begin()
        self._sampler = self._make_sampler(request)
        # an image's stand-in ids are no tokens: the penalties see the prompt's text only
        self._sampler.remember([token for token in prompt if token >= 0] if request.images else prompt)
        self._drafting.start()
        self._report.reused(self._feeder.reuse())
        self.slot.holds(len(self.cache.tokens))

    def prompt_entry(self, room: int) -> BatchEntry:
        """Up to *room* prompt tokens for the next batch (logits after the prompt's last)."""
        return self._feeder.chunk(room)

    def token_entry(self, *, alone: bool) -> BatchEntry:
        """The token to evaluate next, with a draft after it when the generation is *alone* in the batch."""
        assert self._token is not None
        self._feeder.make_room()
        allowed = alone and not self._takes.inserting
        draft = self._drafting.propose(allowed=allowed, tokens_left=self._takes.tokens_left)
        return BatchEntry(self.cache, (self._token, *draft), all_logits=bool(draft))

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*: take the next token, or account for the prompt."""
        if self._takes.waiting:  # the loop settles it beside the decode; never sample before
            self.settle()
            if self.done:
                return
        self.slot.holds(len(self.cache.tokens))
        if self._token is None:  # no token yet: the entry was a prompt chunk
            self._after_prompt_chunk(len(entry.tokens), index)
        elif self._drafting.draft:
            self._after_draft(index)
        else:
            self._begin(self._next(index), index)

    def settle(self) -> None:
        """Take the token whose take waited (on any thread while the decode thread is in ``llama_decode``).

        A stop string it ends names no undecoded token (its cell depends on that decode; see Outcome).
        """
        cause = self._takes.settle()
        if cause is not None:
            self.finish(cause)

    def finish(self, cause: StopCause, *, undecoded: int | None = None) -> None:
        """End the generation: free the sampler and emit its last event."""
        self.close()
        self.outcome = self._report.outcome(cause, undecoded=undecoded)
        self._report.finished(self.outcome)

    def close(self) -> None:
        """Free the sampler (the generation ended, failed or was abandoned); a waiting token counts."""
        self._takes.drop()
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    # ---- the prompt --------------------------------------------------------------------------

    def _after_prompt_chunk(self, n_tokens: int, index: int) -> None:
        self._feeder.read(n_tokens)
        self._report.chunk_read(n_tokens)
        if self._feeder.prefilling:
            return
        if self._ending.nothing_to_generate:  # evaluate the prompt into the cache only
            self.finish(StopCause.LIMIT)
            return
        at = index + n_tokens - 1
        self._begin(self._sample(at), at)

    # ---- the tokens --------------------------------------------------------------------------

    def _begin(self, token: int, at: int) -> None:
        """Take *token* (sampled at *at*), now or later: it ends the generation or is evaluated next."""
        if self._takes.wait(token, at):
            self._token = token
            return
        cause = self._takes.now(token, at)
        if cause is not None:
            self.finish(cause, undecoded=token)
            return
        self._token = token

    def _after_draft(self, index: int) -> None:
        walk = self._drafting.verify(index, self._sample, self._takes.drafted)
        if walk.token is not None:
            self._begin(walk.token, walk.at)
        elif self._takes.walk_ended is not None:
            self.finish(self._takes.walk_ended)
        else:
            self._begin(self._next(walk.at), walk.at)

    def _next(self, index: int) -> int:
        """The next token: an inserted one if the grammar admits it, else one sampled at *index*."""
        sampler = self._sampler
        assert sampler is not None
        inserted = self._takes.inserted(sampler)
        return self._sample(index) if inserted is None else inserted

    def _sample(self, index: int) -> int:
        sampler = self._sampler
        assert sampler is not None
        return self._probabilities.sample(sampler, index)
