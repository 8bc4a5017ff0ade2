"""``TokenTakes``: each sampled token's take, at once or a step later, and the tokens a verdict inserts.

Over the generation's real parts (end policy, log-probabilities, drafting) and
a scripted context; a generation's whole run with takes that wait is in
test_generation.py (``TestATakeThatWaits``).
"""

from __future__ import annotations

import attrs

from bubo.domain.generation import EngineEvent, GenerationRequest, StopCause, ThinkingBudget, TokenGenerated
from bubo.engine._drafting import Drafting
from bubo.engine._end_policy import EndPolicy
from bubo.engine._probabilities import ProbabilityRecorder
from bubo.engine._protocols import BatchEntry
from bubo.engine._token_takes import TokenTakes
from bubo.engine.slots import Slot
from bubo.engine.stats import EngineCounters

from ._scripted import ScriptedContext, ScriptedSampler, pieces

EOG = 0
PROMPT = (5, 6, 7, 8, 9)
LETTER_H, LETTER_I = 7, 8  # the tokens whose pieces are "h" and "i"
AT = len(PROMPT) - 1  # where the scripted context has logits


@attrs.define
class Takes:
    takes: TokenTakes
    slot: Slot
    events: list[EngineEvent]

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.events if isinstance(e, TokenGenerated)]


def takes(*, defer: bool = True, **fields: object) -> Takes:
    context = ScriptedContext(lambda seen: 5)
    context.decode_batch([BatchEntry(context.caches[0], PROMPT)])  # type: ignore[arg-type]  # logits at AT
    fields.setdefault("max_new_tokens", None)
    request = GenerationRequest(prompt_tokens=PROMPT, **fields)  # type: ignore[arg-type]
    slot = Slot(id=0, n_ctx=context.n_ctx_seq, totals=EngineCounters())
    events: list[EngineEvent] = []
    made = TokenTakes(
        slot=slot,
        ending=EndPolicy(request, eog=frozenset({EOG}), n_ctx_train=4096),
        probabilities=ProbabilityRecorder(request, context, pieces()),  # type: ignore[arg-type]
        drafting=Drafting(request, slot, context, policy=None, drafter=None),  # type: ignore[arg-type]
        pieces=pieces(),
        emit=events.append,
        defer=defer,
    )
    return Takes(made, slot, events)


class TestATakeAtOnce:
    def test_counts_the_token_emits_its_text_and_says_what_it_ended(self) -> None:
        run = takes(stop=("hi",))
        assert run.takes.now(LETTER_H, 0) is None
        assert run.takes.now(LETTER_I, 0) is StopCause.STOP_WORD
        assert run.texts == ["", ""]  # "h" held (it may start the stop), then the stop itself
        assert run.slot.decoded == 2


class TestATakeThatWaits:
    def test_waits_only_where_the_verdict_can(self) -> None:
        assert takes().takes.wait(LETTER_H, 0)
        assert not takes(defer=False).takes.wait(LETTER_H, 0)
        assert not takes().takes.wait(EOG, 0)  # the end token is taken at once

    def test_is_neither_counted_nor_emitted_until_settled(self) -> None:
        run = takes(stop=("hi",))
        assert run.takes.now(LETTER_H, 0) is None
        assert run.takes.wait(LETTER_I, 0)
        assert run.takes.waiting
        assert (run.events[1:], run.slot.decoded) == ([], 1)
        assert run.takes.settle() is StopCause.STOP_WORD  # the stop, found a step late
        assert (run.takes.waiting, run.slot.decoded) == (False, 2)
        assert run.texts == ["", ""]

    def test_carries_the_log_probabilities_noted_as_it_was_sampled(self) -> None:
        waiting, at_once = takes(n_probs=1), takes(n_probs=1, max_new_tokens=100)
        waiting.takes.wait(LETTER_H, AT)
        waiting.takes.settle()
        at_once.takes.now(LETTER_H, AT)
        assert waiting.events == at_once.events
        assert isinstance(waiting.events[0], TokenGenerated)
        assert waiting.events[0].logprob is not None

    def test_counts_in_the_tokens_left_before_it_is_settled(self) -> None:
        run = takes(max_new_tokens=10)
        run.takes.wait(LETTER_H, 0)
        assert run.takes.tokens_left == 9

    def test_dropped_with_its_generation_still_counts_as_generated(self) -> None:
        run = takes()
        run.takes.wait(LETTER_H, 0)
        run.takes.drop()
        assert (run.takes.waiting, run.slot.decoded, run.events) == (False, 1, [])


class TestInsertions:
    BUDGET = ThinkingBudget(budget=1, end_tokens=(50, 51), started=True)

    def test_a_spent_budget_s_tokens_replace_sampling_in_order(self) -> None:
        run = takes(thinking_budget=self.BUDGET)
        assert not run.takes.wait(LETTER_H, 0)  # the budget could still ask for an insertion
        assert run.takes.now(LETTER_H, 0) is None
        sampler = ScriptedSampler(ScriptedContext(lambda seen: 5))
        assert [run.takes.inserted(sampler), run.takes.inserted(sampler), run.takes.inserted(sampler)] == [
            50,
            51,
            None,
        ]
        assert sampler.inserted == [50, 51]  # shown to the grammar and penalties

    def test_are_given_up_where_the_grammar_forbids_them(self) -> None:
        run = takes(thinking_budget=self.BUDGET)
        run.takes.now(LETTER_H, 0)
        sampler = ScriptedSampler(ScriptedContext(lambda seen: 5), forbidden=frozenset({50}))
        assert run.takes.inserted(sampler) is None
        assert not run.takes.inserting
