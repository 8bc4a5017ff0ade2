"""When a generation ends and why (``EndPolicy``), token by token, without a model.

Both engines ask the same policy, so these rules hold for the llama.cpp engine
and the fake one alike.
"""

from __future__ import annotations

import attrs

from bubo.domain.generation import GenerationRequest, StopCause, ThinkingBudget
from bubo.engine._end_policy import EndPolicy, Verdict

EOG = 2
PROMPT = (1, 5, 6)


def policy(
    *, n_ctx_train: int = 4096, fits=lambda _n: True, shifts: bool = False, clock=lambda: 0.0, **fields
) -> EndPolicy:
    request = GenerationRequest(
        prompt_tokens=PROMPT, max_new_tokens=fields.pop("max_new_tokens", None), **fields
    )
    return EndPolicy(
        request, eog=frozenset({EOG}), n_ctx_train=n_ctx_train, fits=fits, shifts=shifts, clock=clock
    )


def feed(ending: EndPolicy, *pieces: bytes) -> list[Verdict]:
    """Each piece as the next generated token (ids from 10 up)."""
    return [ending.take(10 + i, piece) for i, piece in enumerate(pieces)]


def text(verdicts: list[Verdict]) -> str:
    return "".join(v.text for v in verdicts)


class TestTheEndToken:
    def test_ends_the_generation_and_releases_what_was_held(self) -> None:
        ending = policy(stop=("STOP",))
        verdicts = feed(ending, b"go ", b"ST")
        assert text(verdicts) == "go "  # "ST" may begin the stop string
        assert ending.take(EOG, b"") == Verdict("ST", StopCause.EOS)
        assert ending.n_generated == 3

    def test_with_ignore_eos_is_a_token_like_any_other(self) -> None:
        ending = policy(ignore_eos=True)
        assert ending.take(EOG, b"x") == Verdict("x", None)


class TestStopStrings:
    def test_end_the_generation_where_they_match_across_tokens(self) -> None:
        ending = policy(stop=("STOP",))
        verdicts = feed(ending, b"hello S", b"TO", b"P and more")
        assert text(verdicts) == "hello "
        assert verdicts[-1].cause is StopCause.STOP_WORD
        assert ending.stop_word == "STOP"

    def test_win_over_the_limit_reached_by_the_same_token(self) -> None:
        ending = policy(stop=("STOP",), max_new_tokens=2)
        verdicts = feed(ending, b"a S", b"TOP")
        assert verdicts[-1].cause is StopCause.STOP_WORD
        assert text(verdicts) == "a "


class TestTheTokenLimit:
    def test_ends_at_the_limit_releasing_everything_held(self) -> None:
        ending = policy(stop=("STOP",), max_new_tokens=2)
        verdicts = feed(ending, b"a", b" ST")
        assert [v.cause for v in verdicts] == [None, StopCause.LIMIT]
        assert text(verdicts) == "a ST"
        assert ending.stop_word is None

    def test_waits_for_the_tokens_that_finish_a_character(self) -> None:
        ending = policy(max_new_tokens=1)
        euro = "€".encode()  # three bytes, here one token each
        verdicts = feed(ending, euro[:1], euro[1:2], euro[2:])
        assert [v.cause for v in verdicts] == [None, None, StopCause.LIMIT]
        assert text(verdicts) == "€"

    def test_waits_at_most_the_three_tokens_a_character_may_need(self) -> None:
        ending = policy(max_new_tokens=1)
        verdicts = feed(ending, "😘".encode()[:1], b"\x9f", b"\x98", b"\x98")
        assert [v.cause for v in verdicts] == [None, None, None, StopCause.LIMIT]
        assert text(verdicts) == "😘"

    def test_of_zero_generates_nothing(self) -> None:
        assert policy(max_new_tokens=0).nothing_to_generate
        assert not policy(max_new_tokens=1).nothing_to_generate
        assert not policy().nothing_to_generate

    def test_says_how_many_tokens_are_left(self) -> None:
        ending = policy(max_new_tokens=5)
        feed(ending, b"a", b"b")
        assert ending.tokens_left == 3
        assert policy().tokens_left is None


class TestTheContext:
    def test_a_token_without_room_to_be_evaluated_ends_it_at_once(self) -> None:
        euro = "€".encode()
        ending = policy(fits=lambda n: n < 2)
        verdicts = feed(ending, b"a", euro[:1])
        assert verdicts[-1].cause is StopCause.CONTEXT  # the context cannot wait for the character
        assert text(verdicts) == "a"  # whose bytes are dropped, not replaced

    def test_without_a_limit_the_training_context_ends_it(self) -> None:
        ending = policy(n_ctx_train=len(PROMPT) + 2)
        verdicts = feed(ending, b"a", b"b")
        assert [v.cause for v in verdicts] == [None, StopCause.CONTEXT]
        limited = policy(n_ctx_train=len(PROMPT) + 2, max_new_tokens=10)  # a context past it, a limit
        assert all(v.cause is None for v in feed(limited, b"a", b"b", b"c"))

    def test_shifting_the_training_context_ends_it_whatever_the_limit(self) -> None:
        """--context-shift: a limit of billions does not keep a generation going past the training context."""
        shifting = policy(n_ctx_train=len(PROMPT) + 2, max_new_tokens=2_000_000_000, shifts=True)
        assert [v.cause for v in feed(shifting, b"a", b"b")] == [None, StopCause.CONTEXT]


class TestTheTimeLimit:
    def test_ends_after_a_new_line_once_the_time_has_passed(self) -> None:
        now = [0.0]
        ending = policy(time_limit_ms=100, clock=lambda: now[0])
        ending.take(10, b"first")
        now[0] = 0.5
        assert ending.take(11, b" line").cause is None  # no new line yet
        assert ending.take(12, b"\nnext").cause is StopCause.TIME

    def test_waits_for_a_character_to_finish(self) -> None:
        now = [0.0]
        euro = "€".encode()
        ending = policy(time_limit_ms=100, clock=lambda: now[0])
        ending.take(10, b"a\n")
        now[0] = 1.0
        assert ending.take(11, euro[:2]).cause is None
        verdict = ending.take(12, euro[2:])
        assert verdict == Verdict("€", StopCause.TIME)

    def test_of_zero_is_none(self) -> None:
        now = [0.0]
        ending = policy(clock=lambda: now[0])
        ending.take(10, b"a\n")
        now[0] = 1e9
        assert ending.take(11, b"b").cause is None


class TestIndentation:
    def test_a_line_indented_less_than_n_indent_is_cut_before_it_starts(self) -> None:
        ending = policy(n_indent=4)
        verdicts = feed(ending, b"def f():\n", b"    return 1\n", b"x = 2")
        assert verdicts[-1] == Verdict("", StopCause.LIMIT)
        assert text(verdicts) == "def f():\n    return 1\n"

    def test_a_first_line_is_not_checked(self) -> None:
        assert all(v.cause is None for v in feed(policy(n_indent=4), b"x = 1", b" + 2"))


class TestTheThinkingBudget:
    END = (90, 91)

    def budget(self, budget: int, **fields) -> ThinkingBudget:
        return ThinkingBudget(budget=budget, end_tokens=self.END, **fields)

    def test_once_spent_asks_for_the_end_of_thinking_once(self) -> None:
        ending = policy(thinking_budget=self.budget(2))
        verdicts = feed(ending, b"<think>", b"hmm", b" so", b" then", b" more")
        assert [v.insert for v in verdicts] == [(), (), self.END, (), ()]
        assert all(v.cause is None for v in verdicts)

    def test_counts_from_the_start_when_thinking_has_begun(self) -> None:
        ending = policy(thinking_budget=self.budget(1, started=True))
        assert ending.take(10, b"hmm").insert == self.END

    def test_is_not_needed_once_thinking_ended_on_its_own(self) -> None:
        ending = policy(thinking_budget=self.budget(3))
        verdicts = feed(ending, b"<think>", b"ok", b"</think>", b"a", b"b", b"c")
        assert all(v.insert == () for v in verdicts)


def test_flush_releases_what_a_stop_string_prefix_held() -> None:
    ending = policy(stop=("STOP",))
    assert text(feed(ending, b"a ST")) == "a "
    assert ending.flush() == "ST"


def test_the_request_decides_the_rules() -> None:
    """The same tokens end differently under different requests' rules."""
    base = GenerationRequest(prompt_tokens=PROMPT, max_new_tokens=3)
    pieces = (b"a", b"b", b"c", b"d")
    loose = EndPolicy(attrs.evolve(base, max_new_tokens=None), eog=frozenset(), n_ctx_train=4096)
    tight = EndPolicy(base, eog=frozenset(), n_ctx_train=4096)
    assert [v.cause for v in feed(loose, *pieces)] == [None] * 4
    assert [v.cause for v in feed(tight, *pieces)][:3] == [None, None, StopCause.LIMIT]


class TestAVerdictThatMayWait:
    """``can_wait``: only a token no rule but a stop string could end the generation with may be taken late."""

    def test_an_ordinary_token_may(self) -> None:
        assert policy(stop=("STOP",)).can_wait(10)

    def test_the_end_token_may_not(self) -> None:
        assert not policy().can_wait(EOG)
        assert policy(ignore_eos=True).can_wait(EOG)  # it ends nothing then

    def test_the_token_that_reaches_the_limit_may_not(self) -> None:
        ending = policy(max_new_tokens=3)
        feed(ending, b"a", b"b")
        assert not ending.can_wait(10)
        assert policy(max_new_tokens=3).can_wait(10)

    def test_a_token_without_room_in_the_context_may_not(self) -> None:
        assert not policy(fits=lambda n: n < 1).can_wait(10)
        assert not policy(n_ctx_train=len(PROMPT) + 1).can_wait(10)  # no limit: the training context ends it

    def test_nothing_may_under_a_time_limit_or_an_indent(self) -> None:
        assert not policy(time_limit_ms=1000).can_wait(10)
        assert not policy(n_indent=2).can_wait(10)

    def test_nothing_may_while_the_thinking_budget_could_insert(self) -> None:
        ending = policy(thinking_budget=ThinkingBudget(budget=2, end_tokens=(7,), started=True))
        assert not ending.can_wait(10)
        assert feed(ending, b"a", b"b")[-1].insert == (7,)  # spent: nothing more to insert
        assert ending.can_wait(10)
