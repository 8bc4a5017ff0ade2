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
- :class:`Drafting`: its :class:`DraftSource` (a draft model's
  :class:`ModelDrafts` when the engine has one, else prompt lookup's), drafts
  to verify while the generation is alone in the batch, within the request's
  ``speculative`` limits, and the :class:`DraftVerifier`'s walk over them;
- :class:`GenerationReport`: the prompt's progress, the timings its slot
  keeps, and the last event with the request's statistics.

Each sampled token is accounted for in one place, :meth:`Generation._take`
(the slot's count, the end policy's verdict, its event with its
log-probabilities, the draft source's history, the tokens to insert next):
what happens after a token is sampled, apart from choosing the next input.

With ``EngineSetup.defer_takes`` (and no draft model) a token whose verdict can wait
(:meth:`EndPolicy.can_wait`: only a stop string could end the generation with
it) is evaluated next before it is taken: its log-probabilities and the draft
source's history are noted as it is sampled, and the rest of its take
(:meth:`Generation.settle`: the slot's count, the verdict, its event) runs
beside the next ``llama_decode``, before the generation samples again.  The
tokens and their text are those of the immediate take; a stop string found
late ends the generation with its last token, and any draft after it, already
in the KV cache (they are the cells of those tokens, which a later prompt may
reuse as far as it matches).

Tokens to insert (the end of thinking) replace sampling while the grammar
admits them; one it forbids gives the insertion up.  Written against the
:mod:`._protocols`, so it runs with a scripted context and sampler.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from bubo.domain.generation import EngineEvent, GenerationRequest, StopCause, TokenGenerated, TokenLogprob

from ._draft_policy import DraftPolicy
from ._drafting import Drafting
from ._end_policy import EndPolicy
from ._generation_report import GenerationReport, Outcome
from ._kv_plan import DiskOffer
from ._model_drafts import Drafter
from ._probabilities import ProbabilityRecorder
from ._prompt_feeder import PromptFeeder
from ._protocols import BatchEntry, DecodeContext, KvSequence, SamplerFactory, TokenSampler
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
        self._pieces = setup.pieces
        self._emit = emit
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
        self._insert: list[int] = []  # tokens inserted instead of sampled (the end of thinking)
        self._token: int | None = None  # sampled (and emitted, unless unsettled), not yet evaluated
        # a draft model's proposal, made as the next batch is planned, would delay the token's event
        self._defers = setup.defer_takes and setup.drafter is None
        self._unsettled: tuple[int, TokenLogprob | None] | None = None  # sampled, its take deferred
        self._walk_ended: StopCause | None = None  # what ended the generation during a draft's walk
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
        return self._unsettled is not None

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
        tokens_left = self._ending.tokens_left
        if tokens_left is not None and self._unsettled is not None:  # the end policy has not counted it
            tokens_left -= 1
        draft = self._drafting.propose(allowed=alone and not self._insert, tokens_left=tokens_left)
        return BatchEntry(self.cache, (self._token, *draft), all_logits=bool(draft))

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*: take the next token, or account for the prompt."""
        if self._unsettled is not None:  # the loop settles it beside the decode; never sample before
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
        """Take the token whose take waited.

        Touches only the generation's own parts (never the KV sequence): it
        may run on another thread while the decode thread is in ``llama_decode``.
        Only a stop string can end the generation here; its outcome names no
        undecoded token (whether the token's cell was kept depends on the
        decode running meanwhile, and only the ends by the end token or a limit,
        always found at once, are read for it).
        """
        assert self._unsettled is not None
        token, logprob = self._unsettled
        self._unsettled = None
        self.slot.generated()
        verdict = self._ending.take(token, self._pieces[token])
        self._emit(TokenGenerated(token_id=token, text=verdict.text, logprob=logprob))
        if verdict.cause is not None:  # a stop string, found a step late
            self.finish(verdict.cause)

    def finish(self, cause: StopCause, *, undecoded: int | None = None) -> None:
        """End the generation: free the sampler and emit its last event."""
        self.close()
        self.outcome = self._report.outcome(cause, undecoded=undecoded)
        self._report.finished(self.outcome)

    def close(self) -> None:
        """Free the sampler (the generation ended, failed or was abandoned).

        A token still waiting for its take (the generation was let go of first)
        is counted as generated, as an immediate take would have counted it.
        """
        if self._unsettled is not None:
            self._unsettled = None
            self.slot.generated()
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
        """Take *token* (sampled from the logits at *at*): it ends the generation or is evaluated next.

        A token whose verdict can wait is evaluated next and taken later (:meth:`settle`).
        """
        if self._defers and self._ending.can_wait(token):
            self._unsettled = (token, self._probabilities.of(token, at))  # the logits at *at* go next
            self._drafting.observe(token)
            self._token = token
            return
        cause = self._take(token, at)
        if cause is not None:
            self.finish(cause, undecoded=token)
            return
        self._token = token

    def _after_draft(self, index: int) -> None:
        walk = self._drafting.verify(index, self._sample, self._take_drafted)
        if walk.token is not None:
            self._begin(walk.token, walk.at)
        elif self._walk_ended is not None:
            self.finish(self._walk_ended)
        else:
            self._begin(self._next(walk.at), walk.at)

    def _take_drafted(self, token: int, at: int) -> bool:
        """Take an accepted draft token; whether the walk goes on."""
        cause = self._take(token, at)
        if cause is not None:
            self._walk_ended = cause
            return False
        return not self._insert

    def _next(self, index: int) -> int:
        """The next token: an inserted one if the grammar admits it, else one sampled at *index*."""
        sampler = self._sampler
        assert sampler is not None
        if self._insert:
            if sampler.allows(self._insert[0]):
                inserted = self._insert.pop(0)
                sampler.accept(inserted)
                return inserted
            self._insert.clear()  # the grammar forbids the end marker here: give up the budget
        return self._sample(index)

    def _sample(self, index: int) -> int:
        sampler = self._sampler
        assert sampler is not None
        return self._probabilities.sample(sampler, index)

    def _take(self, token: int, at: int) -> StopCause | None:
        """Account for one generated token, emit it, and say whether it ends the generation."""
        self.slot.generated()
        verdict = self._ending.take(token, self._pieces[token])
        cause = verdict.cause
        logprob = self._probabilities.of(token, at) if cause is not StopCause.EOS else None
        self._emit(TokenGenerated(token_id=token, text=verdict.text, logprob=logprob))
        if cause is None:
            self._drafting.observe(token)
            self._insert.extend(verdict.insert)
        return cause
