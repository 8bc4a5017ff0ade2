"""Request latencies as open_output measures them, over the fake engine on trio's mock clock.

The fake engine sleeps ``prefill_delay`` before its first token and
``piece_delay`` before each; with the autojump clock only those sleeps (and the
test's own) move time, so every latency is known exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import trio

from bubo.domain.generation import GenerationRequest
from bubo.domain.output import Done, OutputEvent, TextDelta
from bubo.engine import EngineFailure
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.errors import ServiceUnavailable
from bubo.service.generation import PreparedGeneration, collect, open_output
from bubo.service.latency import Outcome, RequestTimeline
from bubo.service.prompt import RenderedPrompt
from bubo.service.runtime import Runtime

PROMPT = (1, 2, 3)
PREPARED = PreparedGeneration(
    prompt=RenderedPrompt(text="x", tokens=PROMPT),
    request=GenerationRequest(prompt_tokens=PROMPT, max_new_tokens=None),
)


@attrs.define
class Recorder:
    """A LatencyObserver that keeps every observation."""

    queue_waits: list[float] = attrs.field(factory=list)
    first_tokens: list[float] = attrs.field(factory=list)
    gaps: list[float] = attrs.field(factory=list)
    requests: list[tuple[float, Outcome]] = attrs.field(factory=list)

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_waits.append(seconds)

    def observe_time_to_first_token(self, seconds: float) -> None:
        self.first_tokens.append(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        self.gaps.append(seconds)

    def observe_request(self, seconds: float, outcome: Outcome) -> None:
        self.requests.append((seconds, outcome))


@pytest.fixture(name="runtime")
def _runtime(make_runtime: Callable[[], Runtime], script: FakeScript) -> Runtime:
    script.reply = "one two three four"  # four pieces
    script.prefill_delay = 2.0
    script.piece_delay = 0.5
    return make_runtime()


@pytest.fixture(name="recorder")
def _recorder() -> Recorder:
    return Recorder()


def arrival(recorder: Recorder) -> RequestTimeline:
    return RequestTimeline(observer=recorder, received=trio.current_time())


async def test_a_finished_request(runtime: Runtime, recorder: Recorder, autojump_clock: trio.abc.Clock):
    """The first token counts from arrival (preparation, queue, prefill); each later token adds one gap."""
    timeline = arrival(recorder)
    await trio.sleep(1.0)  # preparing the request: rendering, tokenizing
    async with open_output(runtime, PREPARED, timeline) as output:
        completion = await collect(output)
    assert completion.text == "one two three four"
    assert recorder.queue_waits == [0.0]
    assert recorder.first_tokens == [pytest.approx(1.0 + 2.0 + 0.5)]
    assert recorder.gaps == [pytest.approx(0.5)] * 3
    assert recorder.requests == [(pytest.approx(1.0 + 2.0 + 4 * 0.5), Outcome.FINISHED)]


async def holding_the_slot(
    runtime: Runtime, recorder: Recorder, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """A whole generation in the (one) slot; started once it holds the slot."""
    async with open_output(runtime, PREPARED, arrival(recorder)) as output:
        task_status.started()
        await collect(output)


async def test_queue_wait_is_the_time_until_the_slot_is_free(
    runtime: Runtime, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """A request that arrives while the slot is held waits for the whole generation ahead of it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(holding_the_slot, runtime, recorder)
        async with open_output(runtime, PREPARED, arrival(recorder)) as output:
            await collect(output)
    generation = 2.0 + 4 * 0.5
    assert recorder.queue_waits == [0.0, pytest.approx(generation)]
    assert recorder.first_tokens == [pytest.approx(2.5), pytest.approx(generation + 2.5)]
    assert recorder.requests == [
        (pytest.approx(generation), Outcome.FINISHED),
        (pytest.approx(2 * generation), Outcome.FINISHED),
    ]


async def test_a_client_that_leaves_mid_stream(
    runtime: Runtime, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """Cancelled after two tokens: one first token, one gap, and a cancelled request of that length."""
    received: list[OutputEvent] = []
    with trio.move_on_after(2.0 + 2 * 0.5 + 0.25):  # the client leaves while the third token is coming
        async with open_output(runtime, PREPARED, arrival(recorder)) as output:
            async for event in output:
                received.append(event)  # noqa: PERF401 - keeps what came before the cancellation
    assert [e.text for e in received if isinstance(e, TextDelta)] == ["one", " two"]
    assert recorder.first_tokens == [pytest.approx(2.5)]
    assert recorder.gaps == [pytest.approx(0.5)]
    assert recorder.requests == [(pytest.approx(3.25), Outcome.CANCELLED)]


async def test_a_consumer_that_stops_reading_is_cancelled_too(
    runtime: Runtime, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """Leaving the block without an error before the end is a cancellation, not a finish."""
    async with open_output(runtime, PREPARED, arrival(recorder)) as output:
        async for event in output:
            if isinstance(event, TextDelta):
                break
    assert recorder.requests == [(pytest.approx(2.5), Outcome.CANCELLED)]
    assert recorder.gaps == []


async def test_a_client_that_leaves_the_queue(
    runtime: Runtime, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """A request that never got the slot has no queue wait, only a cancelled duration."""
    async with trio.open_nursery() as nursery:
        await nursery.start(holding_the_slot, runtime, recorder)
        with trio.move_on_after(1.0):
            async with open_output(runtime, PREPARED, arrival(recorder)):
                pytest.fail("the slot was busy")
    assert recorder.queue_waits == [0.0]
    assert sorted(recorder.requests, key=lambda r: r[0]) == [
        (pytest.approx(1.0), Outcome.CANCELLED),
        (pytest.approx(4.0), Outcome.FINISHED),
    ]


async def test_an_engine_failure(
    runtime: Runtime, script: FakeScript, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """A generation the engine cannot finish ends as failed, its tokens until then timed."""
    script.fail_after = 2
    with pytest.raises(EngineFailure):
        async with open_output(runtime, PREPARED, arrival(recorder)) as output:
            await collect(output)
    assert recorder.first_tokens == [pytest.approx(2.5)]
    assert recorder.gaps == [pytest.approx(0.5)]
    assert recorder.requests == [(pytest.approx(3.0), Outcome.FAILED)]


async def test_a_request_the_engine_refuses(
    runtime: Runtime, fake_engine: FakeEngine, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """A request refused instead of a slot (shutdown) ends as failed, without a queue wait."""
    fake_engine.interrupt(ServiceUnavailable("shutting down", code="not_ready"))
    with pytest.raises(ServiceUnavailable):
        async with open_output(runtime, PREPARED, arrival(recorder)):
            pytest.fail("an interrupted engine gave a slot")
    assert recorder.queue_waits == []
    assert recorder.requests == [(0.0, Outcome.FAILED)]


async def test_done_is_the_last_output_event(
    runtime: Runtime, recorder: Recorder, autojump_clock: trio.abc.Clock
):
    """The timeline passes every engine event through: the output still ends with Done."""
    async with open_output(runtime, PREPARED, arrival(recorder)) as output:
        events = [event async for event in output]
    assert isinstance(events[-1], Done)
    assert recorder.requests[0][1] is Outcome.FINISHED
