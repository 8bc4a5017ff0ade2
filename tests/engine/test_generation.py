"""One request's generation (``Generation``) and its parts, over a scripted context and sampler.

A small driver plays the decode loop's part for a generation alone: a prompt
chunk or the next token (with a draft) per step.  The scripted model says which
token follows any sequence, so what drafting, chunking and shifting produce is
compared with a plain generation token for token; the real model's behaviour is
in test_llama.py and test_prompt_cache.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import pytest

from bubo.domain.generation import (
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    PromptProgress,
    StopCause,
    ThinkingBudget,
    TokenGenerated,
)
from bubo.domain.media import PlacedImage, PromptImage, stand_in_ids
from bubo.domain.sampling import DraftLimits
from bubo.engine._draft_policy import DraftOptions, DraftPolicy
from bubo.engine._draft_verifier import DraftVerifier, LookupDrafts
from bubo.engine._generation import EngineSetup, Generation
from bubo.engine._kv_plan import DiskOffer
from bubo.engine._model_drafts import Drafter
from bubo.engine._protocols import BatchEntry
from bubo.engine.errors import EngineFailure
from bubo.engine.slots import Slot, common_prefix
from bubo.engine.stats import EngineCounters

from ._scripted import ScriptedContext, pieces, sampler_factory

EOG = 0
PATTERN = (5, 6, 7, 8, 9)


def repeating(end_at: int = 120, deviate_every: int = 0):
    """A model that continues a period-5 pattern, says 40 at every *deviate_every*-th position, ends at *end_at*."""

    def model(seen: Sequence[int]) -> int:
        if len(seen) >= end_at:
            return EOG
        if deviate_every and len(seen) % deviate_every == 0:
            return 40
        return seen[-5] if len(seen) >= 5 else PATTERN[0]

    return model


@attrs.define
class Run:
    """A generation over a scripted context, driven alone, and everything it emitted."""

    context: ScriptedContext
    generation: Generation
    events: list[EngineEvent]
    slot: Slot
    deferred: int = 0  # tokens whose take waited for the next decode

    @property
    def tokens(self) -> list[int]:
        return [e.token_id for e in self.events if isinstance(e, TokenGenerated)]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenGenerated))

    @property
    def finished(self) -> GenerationFinished:
        last = self.events[-1]
        assert isinstance(last, GenerationFinished)
        return last


def generate(
    request: GenerationRequest,
    context: ScriptedContext | None = None,
    *,
    drafting: DraftPolicy | None = None,
    drafter: Drafter | None = None,
    chunk: int = 16,
    alone: bool = True,
    context_shift: bool = False,
    offer: DiskOffer | None = None,
    defer: bool = False,
    **sampler: object,
) -> Run:
    """Drive *request* alone as the decode loop does (*defer*: tokens' takes wait, settled after a decode)."""
    context = context or ScriptedContext(repeating())
    events: list[EngineEvent] = []
    slot = Slot(id=0, n_ctx=context.n_ctx_seq, totals=EngineCounters())
    setup = EngineSetup(
        context=context,  # type: ignore[arg-type]
        pieces=pieces(),
        eog=frozenset({EOG}),
        sampler=sampler_factory(context, **sampler),
        drafting=drafter.policy if drafter is not None else drafting,
        drafter=drafter,
        context_shift=context_shift,
        defer_takes=defer,
    )
    generation = Generation(setup, slot, request, emit=events.append, offer=offer)
    generation.start()
    deferred = 0
    for _ in range(10_000):
        if generation.done:
            break
        entry = (
            generation.prompt_entry(chunk) if generation.prefilling else generation.token_entry(alone=alone)
        )
        start = context.decode_image(entry) if entry.image is not None else context.decode_batch([entry])[0]
        if generation.unsettled:  # as the loop does beside the decode: before anything else
            deferred += 1
            generation.settle()
            if generation.done:
                break
        generation.evaluated(entry, start)
    assert generation.done
    return Run(context, generation, events, slot, deferred)


def request(
    prompt: Sequence[int] = PATTERN * 6, max_new_tokens: int | None = None, **fields
) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=tuple(prompt), max_new_tokens=max_new_tokens, **fields)


class TestAGeneration:
    def test_reads_its_prompt_in_chunks_then_generates_until_the_end_token(self) -> None:
        run = generate(request(), chunk=16)
        progress = [e for e in run.events if isinstance(e, PromptProgress)]
        assert [p.processed for p in progress] == [0, 16, 30]  # the first before any chunk, as llama-server's
        assert run.events[0] is progress[0]
        assert run.tokens[-1] == EOG
        assert run.tokens[:5] == list(PATTERN)
        assert run.finished.cause is StopCause.EOS
        assert run.finished.stats.completion_tokens == len(run.tokens) == 120 - 30 + 1
        assert run.generation.outcome is not None
        assert run.generation.outcome.undecoded == EOG  # the end token is never evaluated

    def test_evaluates_every_generated_token_but_the_last_into_its_sequence(self) -> None:
        run = generate(request(max_new_tokens=10))
        assert run.context.caches[0].tokens == [*PATTERN * 6, *run.tokens[:-1]]
        assert run.finished.cause is StopCause.LIMIT

    def test_with_a_limit_of_zero_only_fills_the_cache(self) -> None:
        run = generate(request(max_new_tokens=0))
        assert run.tokens == []
        assert run.finished.cause is StopCause.LIMIT
        assert run.context.caches[0].tokens == list(PATTERN * 6)

    def test_reuses_the_cached_prefix(self) -> None:
        context = ScriptedContext(repeating())
        context.caches[0].tokens.extend(PATTERN * 4)
        run = generate(request(max_new_tokens=3), context)
        assert run.finished.stats.cached_tokens == 20
        assert sum(len(batch[0].tokens) for batch in context.batches[:1]) == 10  # only the rest is read

    def test_hands_the_disk_offer_read_for_it_to_its_sequence(self) -> None:
        offer = DiskOffer(tokens=tuple(PATTERN * 4), adapters=(), payload=bytearray(b"state"))
        run = generate(request(max_new_tokens=1), offer=offer)
        assert run.context.caches[0].offers == [offer]

    def test_that_does_not_fit_the_context_is_refused_at_start(self) -> None:
        with pytest.raises(EngineFailure):
            generate(request(prompt=range(1, 300)))

    def test_frees_its_sampler_when_it_ends(self) -> None:
        run = generate(request(max_new_tokens=2))
        assert run.generation._sampler is None


class TestAnImageInThePrompt:
    """Its positions are evaluated by the projector, alone; they are no tokens for the sampler or drafts."""

    def run(self) -> tuple[Run, GenerationRequest]:
        placed = PlacedImage(
            at=10,
            image=PromptImage(
                tokens=stand_in_ids(b"image" * 8, 4), start=0, n_positions=4, digest="", handle=None
            ),
        )
        prompt = (*PATTERN * 2, *placed.image.tokens, *PATTERN * 3)
        req = request(prompt, images=(placed,))
        return generate(req, drafting=DraftPolicy(DraftOptions(draft_max=8))), req

    def test_is_evaluated_alone_and_the_generation_goes_on(self) -> None:
        run, req = self.run()
        (image,) = run.context.images
        assert image.tokens == req.prompt_tokens[10:14]
        assert all(token >= 0 for batch in run.context.batches for entry in batch for token in entry.tokens)
        assert run.context.caches[0].tokens[: len(req.prompt_tokens)] == list(req.prompt_tokens)
        assert run.tokens[:5] == list(PATTERN)

    def test_the_penalties_see_only_the_prompt_s_text(self) -> None:
        run, req = self.run()
        sampler = run.generation._make_sampler.last  # type: ignore[attr-defined]
        assert sampler.remembered == [token for token in req.prompt_tokens if token >= 0]

    def test_is_never_drafted_over(self) -> None:
        run, _ = self.run()
        assert run.finished.stats.draft_tokens == 0


class TestDrafting:
    def drafting(self) -> DraftPolicy:
        return DraftPolicy(DraftOptions(draft_max=8))

    def test_gives_the_tokens_a_plain_generation_gives(self) -> None:
        """Accepted drafts, rejected ones and their truncation leave exactly the plain output and cache."""
        model = repeating(end_at=200, deviate_every=13)
        plain = generate(request(), ScriptedContext(model))
        drafted = generate(request(), ScriptedContext(model), drafting=self.drafting())
        assert drafted.tokens == plain.tokens
        assert drafted.context.caches[0].tokens == plain.context.caches[0].tokens
        stats = drafted.finished.stats
        assert stats.draft_tokens > stats.draft_accepted > 0  # some drafts were right, some not
        assert len(drafted.context.batches) < len(plain.context.batches)  # fewer steps
        totals = drafted.slot.totals
        assert (totals.draft_tokens, totals.draft_accepted) == (stats.draft_tokens, stats.draft_accepted)

    def test_is_made_only_while_the_generation_is_alone_in_the_batch(self) -> None:
        run = generate(request(), drafting=self.drafting(), alone=False)
        assert run.finished.stats.draft_tokens == 0
        assert all(len(batch[0].tokens) == 1 for batch in run.context.batches[2:])

    def test_stays_within_the_token_limit(self) -> None:
        run = generate(request(max_new_tokens=40), drafting=self.drafting())
        assert len(run.tokens) == 40
        assert run.finished.cause is StopCause.LIMIT


class TestTheVerifier:
    def test_keeps_the_draft_up_to_the_first_token_that_differs(self) -> None:
        verifier = DraftVerifier()
        model = {10: 1, 11: 2, 12: 9}  # batch index -> what is sampled there
        walk = verifier.walk((1, 2, 3), 10, model.__getitem__, lambda _t, _at: True)
        assert (walk.kept, walk.token, walk.at) == (2, 9, 12)
        assert (verifier.drafted, verifier.accepted) == (3, 2)

    def test_samples_after_a_draft_accepted_whole(self) -> None:
        model = {10: 1, 11: 2, 12: 7}
        walk = DraftVerifier().walk((1, 2), 10, model.__getitem__, lambda _t, _at: True)
        assert (walk.kept, walk.token, walk.at) == (2, 7, 12)

    def test_stops_where_an_accepted_token_ends_the_generation(self) -> None:
        taken: list[int] = []
        walk = DraftVerifier().walk((1, 2, 3), 10, lambda at: at - 9, lambda t, _at: taken.append(t) or t < 2)
        assert (walk.kept, walk.token, walk.at) == (2, None, 12)
        assert taken == [1, 2]


class TestLookupDrafts:
    def test_proposes_what_followed_the_last_n_gram_within_the_room(self) -> None:
        policy = DraftPolicy(DraftOptions(draft_max=8))
        for _ in range(30):  # proposals like these have been right
            policy.observe_proposal(2, 6, rejected=False)
        drafts = LookupDrafts((1, 2, 3, 4, 5, 6, 1, 2), policy)
        assert drafts.propose(room=3) == (3, 4, 5)
        drafts.observe(3)
        assert drafts.propose(room=8) == (4, 5, 6, 1, 2)  # the same proposal, followed


class TestThinkingBudget:
    END = (50, 51)

    def thinking(self, **fields) -> GenerationRequest:
        budget = ThinkingBudget(budget=3, end_tokens=self.END, started=True)
        return request(max_new_tokens=12, thinking_budget=budget, **fields)

    def test_inserts_the_end_of_thinking_once_spent(self) -> None:
        run = generate(self.thinking())
        assert run.tokens[3:5] == list(self.END)
        sampler = run.generation._make_sampler.last  # type: ignore[attr-defined]
        assert sampler.inserted == list(self.END)  # shown to the grammar and penalties

    def test_gives_it_up_where_the_grammar_forbids_it(self) -> None:
        run = generate(self.thinking(), forbidden=frozenset({self.END[0]}))
        assert not set(self.END) & set(run.tokens)

    def test_is_not_drafted_over(self) -> None:
        run = generate(self.thinking(), drafting=DraftPolicy(DraftOptions(draft_max=8)))
        assert run.tokens[3:5] == list(self.END)


class TestLogProbabilities:
    def test_come_from_the_logits_at_the_tokens_position(self) -> None:
        run = generate(request(max_new_tokens=3, n_probs=2))
        first = next(e for e in run.events if isinstance(e, TokenGenerated)).logprob
        assert first is not None
        assert first.token_id == PATTERN[0]
        others = sum(math.exp(-t / 10) for t in range(64) if t != PATTERN[0])  # the scripted logits
        assert first.logprob == pytest.approx(5.0 - math.log(math.exp(5.0) + others), rel=1e-4)
        assert [t.token_id for t in first.top] == [PATTERN[0], 0]

    def test_after_the_sampler_chain_when_asked(self) -> None:
        run = generate(request(max_new_tokens=3, n_probs=1, post_sampling_probs=True))
        first = next(e for e in run.events if isinstance(e, TokenGenerated)).logprob
        assert first is not None
        assert first.logprob == pytest.approx(math.log(0.75))
        assert [t.token_id for t in first.top] == [PATTERN[0]]

    def test_none_for_the_end_token_nor_when_not_asked(self) -> None:
        run = generate(request(n_probs=0), ScriptedContext(repeating(end_at=33)))
        assert [e.logprob is None for e in run.events if isinstance(e, TokenGenerated)] == [
            False,
            False,
            False,
            True,
        ]
        plain = generate(request(max_new_tokens=2))
        assert all(e.logprob is None for e in plain.events if isinstance(e, TokenGenerated))


class TestTheContextsEnd:
    def test_ends_the_generation_without_a_shift(self) -> None:
        run = generate(request(), ScriptedContext(repeating(end_at=10_000), n_ctx_seq=40))
        assert run.finished.cause is StopCause.CONTEXT
        assert max(run.context.held) <= 40

    def test_is_passed_with_a_shift(self) -> None:
        context = ScriptedContext(repeating(end_at=10_000), n_ctx_seq=40)
        run = generate(request(max_new_tokens=50, n_keep=4), context, context_shift=True)
        assert run.finished.cause is StopCause.LIMIT
        assert len(run.tokens) == 50
        assert run.finished.stats.context_shifts >= 1
        assert run.generation.outcome is not None
        assert run.generation.outcome.shifted
        assert max(context.held) <= 40


class BrokenContext(ScriptedContext):
    def decode_batch(self, entries: Sequence[BatchEntry]) -> list[int]:
        raise EngineFailure("the draft context broke")


class TestDraftModelDrafting:
    """A draft model's drafts (``ModelDrafts``), verified as lookup drafts are: the output never changes."""

    @staticmethod
    def drafter(model=None, *, mode: str = "always", prior: float = 1.0) -> Drafter:
        policy = DraftPolicy(DraftOptions(draft_max=8, mode=mode), draft_cost_prior=prior)  # type: ignore[arg-type]
        return Drafter(ScriptedContext(model or repeating()), policy)

    def test_a_draft_model_that_is_the_model_has_every_draft_accepted(self) -> None:
        plain = generate(request(max_new_tokens=40))
        drafted = generate(request(max_new_tokens=40), drafter=self.drafter())
        assert drafted.tokens == plain.tokens
        stats = drafted.finished.stats
        assert stats.draft_tokens == stats.draft_accepted > 0
        assert len(drafted.context.batches) < len(plain.context.batches)

    def test_wrong_drafts_are_dropped_and_the_draft_sequence_follows_the_accepted_tokens(self) -> None:
        drafter = self.drafter(repeating(deviate_every=7))
        plain = generate(request(max_new_tokens=60))
        drafted = generate(request(max_new_tokens=60), drafter=drafter)
        assert drafted.tokens == plain.tokens
        stats = drafted.finished.stats
        assert stats.draft_tokens > stats.draft_accepted > 0
        held = drafter.context.caches[0].tokens
        everything = [*PATTERN * 6, *drafted.tokens]
        assert common_prefix(held, everything) >= len(held) - 8  # past it, only the last draft's tail
        # it read the prompt (and the first token) once: later it reads only what follows what it holds
        read = [len(batch[0].tokens) for batch in drafter.context.batches]
        assert read[0] == 30 + 1
        assert max(read[1:]) <= 8

    def test_a_draft_model_stops_at_a_token_it_is_unsure_of(self) -> None:
        """The scripted model gives its token a probability of about 0.93."""
        sure = generate(
            request(max_new_tokens=20, speculative=DraftLimits(p_min=0.9)), drafter=self.drafter()
        )
        unsure = generate(
            request(max_new_tokens=20, speculative=DraftLimits(p_min=0.99)), drafter=self.drafter()
        )
        assert sure.finished.stats.draft_tokens > 0
        assert unsure.finished.stats.draft_tokens == 0

    def test_the_request_limits_the_draft_length(self) -> None:
        run = generate(
            request(max_new_tokens=40, speculative=DraftLimits(n_max=3, n_min=3)), drafter=self.drafter()
        )
        totals = run.slot.totals
        assert totals.draft_steps > 0
        assert totals.draft_tokens == 3 * totals.draft_steps  # never more than n_max, never fewer than n_min
        off = generate(request(max_new_tokens=40, speculative=DraftLimits(n_max=0)), drafter=self.drafter())
        assert off.finished.stats.draft_tokens == 0
        assert off.generation._drafting.source is None

    def test_a_draft_model_as_costly_as_the_model_is_not_run_by_the_measured_policy(self) -> None:
        drafter = self.drafter(mode="measured", prior=1.0)
        run = generate(request(max_new_tokens=40), drafter=drafter)
        assert run.finished.stats.draft_tokens == 0
        assert drafter.context.batches == []  # not even run

    def test_a_failing_draft_model_costs_only_the_drafts(self) -> None:
        drafter = Drafter(BrokenContext(repeating()), DraftPolicy(DraftOptions(draft_max=8, mode="always")))
        plain = generate(request(max_new_tokens=20))
        run = generate(request(max_new_tokens=20), drafter=drafter)
        assert run.tokens == plain.tokens
        assert drafter.failed
        assert run.finished.stats.draft_tokens == 0


class TestATakeThatWaits:
    """``defer_takes``: a token only a stop string could end the generation with is taken after the next decode.

    Whatever waits, the client reads the same events: tokens, texts,
    log-probabilities, the end and its statistics; only the KV sequence of a
    generation a stop string ended holds its last token (and the draft after it).
    """

    CASES = {
        "to the end token": ({}, {}),
        "to the limit": ({"max_new_tokens": 10}, {}),
        "to a stop string": ({"stop": ("hi",)}, {}),
        "with log-probabilities": ({"stop": ("hi",), "n_probs": 2}, {}),
        "after the sampler chain": ({"max_new_tokens": 8, "n_probs": 1, "post_sampling_probs": True}, {}),
        "with drafts": (
            {"stop": ("ohi",)},
            {"drafting": DraftPolicy(DraftOptions(draft_max=8, mode="always"))},
        ),
        "with a thinking budget": (
            {
                "max_new_tokens": 12,
                "thinking_budget": ThinkingBudget(budget=3, end_tokens=(50, 51), started=True),
            },
            {},
        ),
    }

    @staticmethod
    def seen(run: Run) -> list[object]:
        """What the client reads, less the timings."""
        finished = run.finished
        stats = attrs.evolve(finished.stats, prompt_ms=0.0, predicted_ms=0.0)
        return [
            *(e for e in run.events if isinstance(e, TokenGenerated)),
            attrs.evolve(finished, stats=stats),
        ]

    def both(self, case: str) -> tuple[Run, Run]:
        fields, options = self.CASES[case]
        runs = []
        for defer in (False, True):
            # with drafts: the pattern is broken by token 40 ("o") at every 23rd position, drafted over after
            context = ScriptedContext(repeating(deviate_every=23)) if "drafting" in options else None
            runs.append(generate(request(**fields), context, defer=defer, **options))  # type: ignore[arg-type]
        return runs[0], runs[1]

    @pytest.mark.parametrize("case", list(CASES))
    def test_the_client_reads_what_an_immediate_take_gives(self, case: str) -> None:
        immediate, waiting = self.both(case)
        assert immediate.deferred == 0
        assert waiting.deferred > 0
        assert self.seen(waiting) == self.seen(immediate)

    @pytest.mark.parametrize("case", ["to the end token", "to the limit", "after the sampler chain"])
    def test_an_end_by_the_end_token_or_a_limit_is_taken_at_once(self, case: str) -> None:
        immediate, waiting = self.both(case)
        # the last token is never evaluated, either way
        assert waiting.context.caches[0].tokens == immediate.context.caches[0].tokens
        assert waiting.generation.outcome == immediate.generation.outcome  # undecoded: the last token

    def test_a_stop_string_found_late_leaves_its_last_token_in_the_sequence(self) -> None:
        immediate, waiting = self.both("to a stop string")
        assert immediate.finished.cause is StopCause.STOP_WORD
        last = waiting.tokens[-1]
        assert waiting.context.caches[0].tokens == [*immediate.context.caches[0].tokens, last]
        assert immediate.generation.outcome is not None
        assert waiting.generation.outcome is not None
        assert (immediate.generation.outcome.undecoded, waiting.generation.outcome.undecoded) == (last, None)

    def test_a_stop_string_found_late_keeps_the_draft_evaluated_after_it(self) -> None:
        immediate, waiting = self.both("with drafts")
        assert immediate.finished.stats.draft_accepted > 0
        evaluated = immediate.context.caches[0].tokens
        kept = waiting.context.caches[0].tokens
        assert kept[: len(evaluated) + 1] == [*evaluated, waiting.tokens[-1]]
        assert len(kept) > len(evaluated) + 1  # a draft was evaluated after the stop's last token

    def test_a_token_still_waiting_when_the_generation_is_let_go_of_counts_as_generated(self) -> None:
        context = ScriptedContext(repeating())
        slot = Slot(id=0, n_ctx=context.n_ctx_seq, totals=EngineCounters())
        setup = EngineSetup(
            context=context,  # type: ignore[arg-type]
            pieces=pieces(),
            eog=frozenset({EOG}),
            sampler=sampler_factory(context),
            defer_takes=True,
        )
        generation = Generation(setup, slot, request(), emit=lambda _event: None)
        generation.start()
        entry = generation.prompt_entry(64)
        generation.evaluated(entry, context.decode_batch([entry])[0])  # the prompt, and a first token
        assert generation.unsettled
        generation.close()  # its client left before the next step
        assert slot.decoded == slot.totals.tokens_predicted == 1

    def test_nothing_waits_beside_a_draft_model(self) -> None:
        """Its proposal is made as the next batch is planned: a waiting token's event would wait for it."""
        drafter = TestDraftModelDrafting.drafter()
        waiting = generate(request(stop=("hi",)), defer=True, drafter=drafter)
        assert waiting.deferred == 0
        assert waiting.finished.cause is StopCause.STOP_WORD

    def test_the_thinking_budget_s_insertion_is_never_late(self) -> None:
        immediate, waiting = self.both("with a thinking budget")
        assert waiting.tokens[3:5] == immediate.tokens[3:5] == [50, 51]
        # taken at once: the three thinking tokens while the budget could still insert, and the limit's
        assert waiting.deferred == len(waiting.tokens) - 4
