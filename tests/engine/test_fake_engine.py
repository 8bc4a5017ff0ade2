"""The fake engine ends its replies by the llama.cpp engine's own rules (``EndPolicy``), not a copy of them.

What the rules are is ``test_end_policy.py``'s; here the fake engine is seen
to ask them, so the tests above the engine meet the engine's behaviour.
"""

from __future__ import annotations

from bubo.domain.generation import (
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    PromptProgress,
    StopCause,
    ThinkingBudget,
    TokenGenerated,
)
from bubo.engine.fake import FakeEngine, FakeScript

END_OF_THINKING = (900, 901)


async def run(script: FakeScript, **fields) -> tuple[list[EngineEvent], str, GenerationFinished]:
    """One generation of a 3-token prompt; its events, its text and its end."""
    engine = FakeEngine(script=script)
    request = GenerationRequest(
        prompt_tokens=(1, 5, 6), max_new_tokens=fields.pop("max_new_tokens", None), **fields
    )
    events: list[EngineEvent] = []
    async with engine.open_generation(request) as channel:
        events.extend([event async for event in channel])
    text = "".join(event.text for event in events if isinstance(event, TokenGenerated))
    finished = events[-1]
    assert isinstance(finished, GenerationFinished)
    return events, text, finished


async def test_a_reply_of_exactly_the_limit_ends_with_the_limit() -> None:
    _, text, finished = await run(FakeScript(reply="one two three"), max_new_tokens=3)
    assert (text, finished.cause, finished.stats.completion_tokens) == ("one two three", StopCause.LIMIT, 3)


async def test_a_reply_that_runs_out_ends_as_the_model_would() -> None:
    _, text, finished = await run(FakeScript(reply="one two"), max_new_tokens=3)
    assert (text, finished.cause) == ("one two", StopCause.EOS)


async def test_a_stop_string_across_pieces_ends_it_where_it_matched() -> None:
    _, text, finished = await run(FakeScript(pieces=(b"a", b" ST", b"OP", b" b")), stop=("STOP",))
    assert (text, finished.cause, finished.stop_word) == ("a ", StopCause.STOP_WORD, "STOP")


async def test_a_line_indented_less_than_n_indent_is_cut_before_it_starts() -> None:
    _, text, finished = await run(FakeScript(pieces=(b"x", b"\n    y", b"\nz", b" w")), n_indent=4)
    assert (text, finished.cause) == ("x\n    y\n", StopCause.LIMIT)


async def test_the_time_limit_ends_it_after_a_new_line(autojump_clock) -> None:
    """Measured on trio's clock, as the fake engine's pieces are delayed (autojump: no real waiting)."""
    script = FakeScript(pieces=(b"a", b" b", b"\n", b"c", b" d"), piece_delay=1.0)
    _, text, finished = await run(script, time_limit_ms=1500)
    assert (text, finished.cause) == ("a b\n", StopCause.TIME)


async def test_a_spent_thinking_budget_inserts_the_end_of_thinking() -> None:
    script = FakeScript(
        pieces=(b"<think>", b"hmm", b" so", b" then", b"answer"),
        vocabulary={900: b"\n</think>", 901: b"\n\n"},
    )
    events, text, finished = await run(
        script, thinking_budget=ThinkingBudget(budget=2, end_tokens=END_OF_THINKING)
    )
    tokens = [event.token_id for event in events if isinstance(event, TokenGenerated)]
    assert tokens[3:5] == list(END_OF_THINKING)  # after the budget's two thinking tokens
    assert text == "<think>hmm so\n</think>\n\n then" + "answer"
    assert (finished.cause, finished.stats.completion_tokens) == (StopCause.EOS, 7)


async def test_reports_progress_before_the_prompt_is_read_as_the_engine_does() -> None:
    events, _, _ = await run(FakeScript(reply="x"))
    progress = [event for event in events if isinstance(event, PromptProgress)]
    assert events[0] is progress[0]
    assert [p.processed for p in progress] == [0, 3]


async def test_a_limit_of_zero_generates_nothing() -> None:
    events, _, finished = await run(FakeScript(reply="one two"), max_new_tokens=0)
    assert not [event for event in events if isinstance(event, TokenGenerated)]
    assert (finished.cause, finished.stats.completion_tokens) == (StopCause.LIMIT, 0)
