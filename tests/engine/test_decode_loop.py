"""The decode loop's scheduling and failure handling, with a scripted context and scripted sequences.

What goes into each batch (every generating token, then prompt chunks up to the
chunk size, oldest first), who ends when a decode fails, how a full shared KV
cache is made room in, and what a bug anywhere in the loop leaves behind
(nothing that waits for ever); the real engine's behaviour is in
test_parallel.py and test_llama_failures.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import attrs
import pytest
import trio

from bubo.domain.generation import StopCause
from bubo.domain.media import PromptImage
from bubo.engine._beside import Beside
from bubo.engine._courier import Courier
from bubo.engine._crossing import Job, post_to_trio
from bubo.engine._decode_loop import DecodeLoop
from bubo.engine._prefill_budget import PrefillBudget, attended_cells
from bubo.engine._protocols import BatchEntry, ContextFull
from bubo.engine.errors import Cause, EngineFailure
from bubo.engine.lora import AdapterSet

WAIT_S = 10
IMAGE_POSITIONS = 6
IMAGE = PromptImage(
    tokens=(-1,) * IMAGE_POSITIONS, start=0, n_positions=IMAGE_POSITIONS, digest="", handle=None
)


@attrs.define(eq=False)
class ScriptedCache:
    seq_id: int
    tokens: list[int] = attrs.field(factory=list)
    evicted: int = 0
    parked: int = 0
    shared: int = 0  # of its tokens, those another sequence holds the cells of too

    @property
    def private_cells(self) -> int:
        return len(self.tokens) - self.shared

    def evict(self) -> None:
        self.evicted += 1
        self.tokens.clear()

    def park(self) -> None:
        self.parked += 1
        self.tokens.clear()

    def clear(self) -> None:
        self.tokens.clear()


@attrs.define(eq=False)
class ScriptedContext:
    """Records every batch; ``failures`` are raised by the next decodes, in order."""

    caches: tuple[ScriptedCache, ...]
    n_batch: int = 512
    batches: list[list[tuple[int, int]]] = attrs.field(factory=list)  # (seq_id, n_tokens) per entry
    failures: list[Exception] = attrs.field(factory=list)
    fail_once: Callable[[list[BatchEntry]], Exception | None] | None = None  # a failure for some batch
    wedged: threading.Event | None = None  # decodes block until it is set (a device that hangs)
    stuck: threading.Event = attrs.field(factory=threading.Event)  # a decode is blocked on wedged
    applied: AdapterSet = ()  # the LoRA adapter set in force
    batch_adapters: list[AdapterSet] = attrs.field(factory=list)  # the set in force at each decode
    images: list[tuple[int, int, int]] = attrs.field(factory=list)  # (seq_id, positions, batches before)
    image_failures: list[Exception] = attrs.field(factory=list)  # raised by the next image decodes
    while_decoding: Callable[[], None] | None = None  # called inside each decode (as llama_decode runs)

    def use_adapters(self, adapters: AdapterSet) -> None:
        self.applied = adapters

    def decode_batch(self, entries: list[BatchEntry]) -> list[int]:
        if self.while_decoding is not None:
            self.while_decoding()
        if self.wedged is not None:
            self.stuck.set()
            self.wedged.wait()
        if self.failures:
            raise self.failures.pop(0)
        failure = self.fail_once(entries) if self.fail_once is not None else None
        if failure is not None:
            self.fail_once = None
            raise failure
        self.batches.append([(entry.cache.seq_id, len(entry.tokens)) for entry in entries])
        self.batch_adapters.append(self.applied)
        starts, at = [], 0
        for entry in entries:
            assert entry.image is None, "an image is never part of a batch"
            starts.append(at)
            at += len(entry.tokens)
            entry.cache.tokens.extend(entry.tokens)
        return starts

    def decode_image(self, entry: BatchEntry) -> int:
        if self.image_failures:
            raise self.image_failures.pop(0)
        self.images.append((entry.cache.seq_id, len(entry.tokens), len(self.batches)))
        entry.cache.tokens.extend(entry.tokens)
        return -1


@attrs.define(eq=False)
class ScriptedSequence:
    """A prompt of ``prompt`` tokens, then ``generate`` tokens, one a step."""

    cache: ScriptedCache
    prompt: int
    generate: int
    cancelled: bool = False
    done: bool = False
    closed: bool = False
    finished_by: StopCause | None = None
    read: int = 0
    generated: int = 0
    on_step: Callable[[], None] | None = None
    on_start: Callable[[], None] | None = None
    close_error: Exception | None = None
    adapters: AdapterSet = ()
    waits: bool = False  # each generated token's take waits for the next decode (settle)
    unsettled: bool = False
    stop_late_at: int | None = None  # the settle of this generated token ends it (a stop string)
    settle_error: Exception | None = None
    settled: list[str] = attrs.Factory(list)  # the thread of each settle

    def settle(self) -> None:
        assert self.unsettled
        self.settled.append(threading.current_thread().name)
        self.unsettled = False
        if self.settle_error is not None:
            raise self.settle_error
        if self.generated == self.stop_late_at:
            self.finish(StopCause.STOP_WORD)

    @property
    def prefilling(self) -> bool:
        return self.read < self.prompt

    @property
    def prompt_left(self) -> int:
        return self.prompt - self.read

    def start(self) -> None:
        if self.on_start is not None:
            self.on_start()

    image_at: int | None = None  # where an image of IMAGE_POSITIONS positions starts in the prompt

    def prompt_entry(self, room: int) -> BatchEntry:
        if self.read == self.image_at:
            return BatchEntry(self.cache, (-1,) * IMAGE_POSITIONS, image=IMAGE)  # type: ignore[arg-type]
        end = self.prompt if self.image_at is None or self.read > self.image_at else self.image_at
        return BatchEntry(self.cache, (1,) * min(room, end - self.read))  # type: ignore[arg-type]

    def token_entry(self, *, alone: bool) -> BatchEntry:
        return BatchEntry(self.cache, (2,))  # type: ignore[arg-type]

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        assert not self.unsettled, "sampled before its last token was settled"
        if self.prefilling:
            self.read += len(entry.tokens)
        else:
            self.generated += 1
            self.unsettled = self.waits
        if self.on_step is not None:
            self.on_step()
        if self.generated >= self.generate:
            self.done = True

    def finish(self, cause: StopCause) -> None:
        self.finished_by = cause
        self.done = True

    def close(self) -> None:
        self.closed = True
        if self.close_error is not None:
            raise self.close_error


@pytest.fixture(autouse=True)
def _every_loop_stopped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each loop a test started is stopped after it, passed or failed.

    A sequence here may generate until it is failed (``Run.generating``): a test that fails before
    its loop is lost or stopped would leave that thread generating, and growing, through every
    later test of the session.
    """
    runs: list[Run] = []
    start = Run.__init__

    def started(run: Run, *args: object, **kwargs: object) -> None:
        start(run, *args, **kwargs)  # type: ignore[arg-type]
        runs.append(run)

    monkeypatch.setattr(Run, "__init__", started)
    yield
    for run in runs:
        assert run.loop.stop(WAIT_S), "a decode loop did not stop"


class Run:
    """A loop over a scripted context; ``join`` submits sequences and waits for all to end."""

    def __init__(
        self,
        n_slots: int = 4,
        chunk: int = 8,
        *,
        park_idle: bool = False,
        prefill: PrefillBudget | None = None,
        on_lost: Callable[[EngineFailure], None] | None = None,
        beside: Beside | None = None,
    ) -> None:
        """*on_lost*: called with the loss too (after it is noted in ``lost``)."""
        self.context = ScriptedContext(tuple(ScriptedCache(i) for i in range(n_slots)))
        self.lost: list[EngineFailure] = []
        self.loop = DecodeLoop(
            self.context,
            prefill=prefill or PrefillBudget(fixed=chunk, n_batch=self.context.n_batch),
            drafting=None,
            to_trio=Courier(),
            beside=beside,
            park_idle=park_idle,
            on_lost=lambda failure: (self.lost.append(failure), on_lost and on_lost(failure)),
        )  # type: ignore[arg-type]
        self.ended: dict[int, BaseException | None] = {}
        self._done: dict[int, threading.Event] = {}

    def sequence(self, slot: int, prompt: int, generate: int, adapters: AdapterSet = ()) -> ScriptedSequence:
        return ScriptedSequence(self.context.caches[slot], prompt, generate, adapters=adapters)

    def submit(self, *sequences: ScriptedSequence) -> None:
        """Submit *sequences* so that the loop takes them in the same step."""
        with self.loop._inbox._wakeup:  # reentrant: the loop waits until all are in
            self._submit(sequences)

    def _submit(self, sequences: tuple[ScriptedSequence, ...]) -> None:
        for sequence in sequences:
            seq_id = sequence.cache.seq_id
            self._done[seq_id] = threading.Event()

            def ended(error: BaseException | None, seq_id: int = seq_id) -> None:
                self.ended[seq_id] = error
                self._done[seq_id].set()

            self.loop.submit(sequence, ended)  # type: ignore[arg-type]

    def wait(self) -> None:
        for event in self._done.values():
            assert event.wait(WAIT_S)

    def wait_for(self, slot: int) -> None:
        assert self._done[slot].wait(WAIT_S)

    def generating(self, slot: int) -> ScriptedSequence:
        """A sequence in *slot* that generates until it is failed; returned once it has generated."""
        sequence = self.sequence(slot, prompt=2, generate=10**9)
        generated = threading.Event()
        sequence.on_step = generated.set
        self.submit(sequence)
        assert generated.wait(WAIT_S)
        return sequence

    def post(
        self, function: Callable[[], object], *, idle: bool = False
    ) -> Callable[[], BaseException | None]:
        """Post *function* as a job (as idle work with *idle*); the returned function waits for its error."""
        outcome: list[BaseException | None] = []
        ended = threading.Event()

        def end(_result: object, error: BaseException | None) -> None:
            outcome.append(error)
            ended.set()

        job = Job(function, ended=end)
        (self.loop.post_idle if idle else self.loop.post)(job)

        def result() -> BaseException | None:
            assert ended.wait(WAIT_S)
            assert len(outcome) == 1  # heard once
            return outcome[0]

        return result

    def close(self) -> None:
        self.loop.stop()


def test_every_step_holds_each_generating_token_and_at_most_a_chunk_of_prompt() -> None:
    run = Run(chunk=8)
    sequences = (
        run.sequence(0, prompt=4, generate=12),
        run.sequence(1, prompt=30, generate=2),
        run.sequence(2, prompt=30, generate=2),
    )
    try:
        run.submit(*sequences)
        run.wait()
    finally:
        run.close()
    # the chunk is shared: a floor for each prompt, the rest oldest first
    assert run.context.batches[0] == [(0, 4), (1, 3), (2, 1)]
    for batch in run.context.batches:  # prompt tokens: at most a chunk a step (each stream adds one)
        assert sum(n for _, n in batch) <= 8 + len(batch)
    generating = run.context.batches[1:13]  # slot 0's twelve tokens, one a step
    assert all((0, 1) in batch for batch in generating)
    read = {1: 0, 2: 0}
    for batch in map(dict, run.context.batches):
        if read[1] < 30:  # while both prompts are being read, each advances, the older more
            assert batch[2] >= 1
            assert batch[1] >= batch[2] or read[1] + batch[1] == 30
        for seq in (1, 2):
            read[seq] += batch.get(seq, 0)
    assert run.ended == {0: None, 1: None, 2: None}


class TestAnImageInAPrompt:
    """The projector evaluates an image alone, between steps; the other sequences go on around it."""

    def test_is_evaluated_alone_whatever_the_room_and_the_prompt_goes_on_after_it(self) -> None:
        run = Run(chunk=4)
        stream = run.sequence(0, prompt=2, generate=20)
        reading = run.sequence(1, prompt=18, generate=1)
        reading.image_at = 5
        try:
            run.submit(stream, reading)
            run.wait()
        finally:
            run.close()
        ((seq_id, positions, before),) = run.context.images
        assert (seq_id, positions) == (1, IMAGE_POSITIONS)  # 6 positions with a room of 4 a step
        # the text before it was read in the batches before, and the stream kept its step
        assert sum(dict(batch).get(1, 0) for batch in run.context.batches[:before]) == 5
        assert all((0, 1) in batch for batch in run.context.batches[1:before])
        assert reading.read == 18
        assert run.ended == {0: None, 1: None}

    def test_a_failed_image_ends_its_own_request_only(self) -> None:
        run = Run(chunk=4)
        run.context.image_failures.append(EngineFailure("the projector failed"))
        stream = run.sequence(0, prompt=2, generate=20)
        reading = run.sequence(1, prompt=18, generate=1)
        reading.image_at = 0
        try:
            run.submit(stream, reading)
            run.wait()
        finally:
            run.close()
        assert isinstance(run.ended[1], EngineFailure)
        assert run.ended[0] is None
        assert stream.generated == 20
        assert not run.lost


class RecordingBudget(PrefillBudget):
    """A fixed chunk that records what each step is measured as."""

    def __init__(self, chunk: int) -> None:
        super().__init__(fixed=chunk, n_batch=512)
        self.observed: list[tuple[int, int]] = []  # (tokens, cells attended to) a step
        self.asked: list[tuple[int, int, int]] = []  # (streams' tokens, their cells, prompt position)

    def observe(self, n_tokens: int, seconds: float, *, cells: int = 0) -> None:
        self.observed.append((n_tokens, cells))
        super().observe(n_tokens, seconds, cells=cells)

    def room(self, n_decoding: int, *, streams_cells: int = 0, prompt_at: int = 0) -> int:
        self.asked.append((n_decoding, streams_cells, prompt_at))
        return super().room(n_decoding, streams_cells=streams_cells, prompt_at=prompt_at)


def test_each_step_is_measured_by_its_tokens_and_the_cells_they_attend_to(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the prefill budget fits the step cost to; with debug logging on, one line a step."""
    budget = RecordingBudget(chunk=8)
    run = Run(prefill=budget)
    caplog.set_level(logging.DEBUG, logger="bubo.engine._decode_loop")
    try:
        run.submit(run.sequence(0, prompt=12, generate=2))
        run.wait()
        stream = run.generating(2)
        at = len(stream.cache.tokens)
        run.context.caches[1].tokens.extend([7] * 5)  # a cached prefix: the prompt goes on from 5
        run.submit(run.sequence(1, prompt=3, generate=1))
        run.wait_for(1)
    finally:
        run.close()
    # slot 0: 8 prompt tokens from position 0, the other 4 from 8, then a token at 12 (its second ends it)
    assert budget.observed[:3] == [
        (8, attended_cells(0, 8)),
        (4, attended_cells(8, 4)),
        (1, attended_cells(12, 1)),
    ]
    steps = [record.getMessage() for record in caplog.records if record.getMessage().startswith("step ")]
    assert len(steps) == len(budget.observed)
    assert steps[0].startswith("step 1: 0 stream token(s), 8 prompt token(s) [8], ")
    assert any(" 1 stream token(s), 3 prompt token(s) [3], " in step for step in steps)
    # asked for slot 1's chunk beside slot 2's token: the stream's cells and the prompt's position
    beside = [asked for asked in budget.asked if asked[2] == 5]
    assert beside
    assert beside[0][0] == 1
    assert beside[0][1] >= attended_cells(at, 1)


def test_a_cancelled_sequence_is_let_go_at_the_next_step() -> None:
    run = Run()
    long = run.sequence(0, prompt=2, generate=10_000)
    other = run.sequence(1, prompt=2, generate=20)
    long.on_step = lambda: setattr(long, "cancelled", long.generated >= 3)
    try:
        run.submit(long, other)
        run.wait()
    finally:
        run.close()
    assert run.ended == {0: None, 1: None}
    assert long.closed
    assert 3 <= long.generated < 10
    assert other.generated == 20


def test_a_fatal_failure_ends_every_sequence_and_refuses_later_ones() -> None:
    run = Run()
    fatal = EngineFailure("llama_decode failed with status -3", fatal=True)
    try:
        run.submit(run.sequence(0, prompt=2, generate=50), run.sequence(1, prompt=2, generate=50))
        run.context.failures.append(fatal)
        run.wait()
        assert run.ended == {0: fatal, 1: fatal}
        run.submit(run.sequence(2, prompt=2, generate=1))
        run.wait()
        assert run.ended[2] is fatal
    finally:
        run.close()


def test_a_recoverable_failure_ends_only_the_batch_it_was_in() -> None:
    run = Run()
    failure = EngineFailure("llama_decode failed with status -1")
    run.context.failures.append(failure)
    try:
        run.submit(run.sequence(0, prompt=2, generate=3))
        run.wait()
        assert run.ended == {0: failure}
        run.submit(run.sequence(1, prompt=2, generate=3))
        run.wait()
        assert run.ended[1] is None
    finally:
        run.close()


class TestLoraAdapterSets:
    """Requests under different LoRA adapter sets never share a decode step, and the sets take turns."""

    def test_each_step_holds_one_set_applied_before_it_is_decoded(self) -> None:
        run = Run(chunk=8)
        adapted = ((0, 1.0),)
        sequences = (
            run.sequence(0, prompt=4, generate=6),
            run.sequence(1, prompt=4, generate=6, adapters=adapted),
            run.sequence(2, prompt=4, generate=6),
        )
        try:
            run.submit(*sequences)
            run.wait()
        finally:
            run.close()
        by_slot = {0: (), 1: adapted, 2: ()}
        for batch, applied in zip(run.context.batches, run.context.batch_adapters, strict=True):
            assert {by_slot[seq] for seq, _ in batch} == {applied}
        assert all(error is None for error in run.ended.values())
        assert [s.generated for s in sequences] == [6, 6, 6]

    def test_the_sets_take_turns_step_by_step(self) -> None:
        run = Run(chunk=8)
        sequences = (
            run.sequence(0, prompt=1, generate=5),
            run.sequence(1, prompt=1, generate=5, adapters=((0, 0.5),)),
        )
        try:
            run.submit(*sequences)
            run.wait()
        finally:
            run.close()
        assert run.context.batch_adapters == [(), ((0, 0.5),)] * 6  # the prompt, then five tokens each


class TestAFullSharedContext:
    def test_idle_slots_give_their_cells_first(self) -> None:
        run = Run()
        run.context.caches[3].tokens.extend(range(100))  # an idle slot's cached conversation
        run.context.fail_once = lambda _: ContextFull("no room")
        try:
            run.submit(run.sequence(0, prompt=4, generate=2))
            run.wait()
        finally:
            run.close()
        assert run.context.caches[3].evicted == 1
        assert run.ended == {0: None}

    def test_an_idle_slot_whose_cells_are_all_shared_is_kept_while_another_frees_room(self) -> None:
        """Evicting a sequence whose every cell another one holds frees nothing: the one with its own go."""
        run = Run()
        run.context.caches[2].tokens.extend(range(100))
        run.context.caches[2].shared = 100  # its cells are another sequence's too
        run.context.caches[3].tokens.extend(range(100))
        run.context.fail_once = lambda _: ContextFull("no room")
        try:
            run.submit(run.sequence(0, prompt=4, generate=2))
            run.wait()
        finally:
            run.close()
        assert (run.context.caches[2].evicted, run.context.caches[3].evicted) == (0, 1)
        assert run.ended == {0: None}

    def test_then_the_newest_prompt_being_read_gets_a_503(self) -> None:
        run = Run(chunk=8)
        old, new = run.sequence(0, prompt=4, generate=30), run.sequence(1, prompt=40, generate=2)
        run.context.fail_once = lambda entries: (
            ContextFull("no room") if len(entries) == 2 and old.read else None
        )
        try:
            run.submit(old, new)
            run.wait()
        finally:
            run.close()
        refused = run.ended[1]
        assert isinstance(refused, ContextFull)
        assert refused.code == "context_full"
        assert run.ended[0] is None
        assert old.generated == 30

    def test_with_every_sequence_generating_the_longest_fails_and_the_other_gets_all_it_asked_for(
        self,
    ) -> None:
        """Not a "length" stop: its client would read a short answer as one that reached its limit."""
        run = Run()
        short, long = run.sequence(0, prompt=2, generate=50), run.sequence(1, prompt=20, generate=50)
        run.context.fail_once = lambda _: ContextFull("no room") if short.generated == 5 else None
        try:
            run.submit(short, long)
            run.wait()
        finally:
            run.close()
        failed = run.ended[1]
        assert isinstance(failed, ContextFull)
        assert failed.code == "context_full"
        assert failed.message.startswith("Context size has been exceeded")
        assert failed.cause is Cause.CONTEXT_FULL  # the API answers 503 with Retry-After
        assert long.finished_by is None
        assert run.context.caches[1].evicted == 1
        assert run.ended[0] is None
        assert short.generated == 50


class TestIdleSlotsParked:
    """With ``park_idle`` an admitted generation moves every idle slot's sequence out of the cache."""

    def test_after_the_new_generation_took_its_prefix_and_before_its_first_step(self) -> None:
        run = Run(park_idle=True)
        idle = run.context.caches[3]
        idle.tokens.extend(range(100))  # an idle slot's conversation, perhaps the prefix the new one shares
        held_at_start: list[int] = []
        held_at_decode: list[int] = []
        run.context.fail_once = lambda _: held_at_decode.append(len(idle.tokens))  # type: ignore[func-returns-value]
        sequence = run.sequence(0, prompt=4, generate=2)
        sequence.on_start = lambda: held_at_start.append(len(idle.tokens))
        try:
            run.submit(sequence)
            run.wait()
        finally:
            run.close()
        assert held_at_start == [100]
        assert idle.parked == 1
        assert held_at_decode[0] == 0
        assert run.ended == {0: None}

    def test_never_a_slot_in_use(self) -> None:
        run = Run(park_idle=True)
        run.context.caches[2].tokens.extend(range(100))
        try:
            streaming = run.generating(1)
            assert run.context.caches[2].parked == 1  # parked when the stream was admitted
            run.submit(run.sequence(0, prompt=4, generate=2))
            run.wait_for(0)  # the stream goes on
            assert run.context.caches[1].parked == 0
            assert streaming.generated > 0
            assert not streaming.done
        finally:
            run.close()
        assert (run.context.caches[0].parked, run.context.caches[3].parked) == (0, 0)  # they held nothing

    def test_not_without_it(self) -> None:
        run = Run(park_idle=False)
        run.context.caches[3].tokens.extend(range(100))
        try:
            run.submit(run.sequence(0, prompt=4, generate=2))
            run.wait()
        finally:
            run.close()
        assert run.context.caches[3].parked == 0
        assert len(run.context.caches[3].tokens) == 100


def break_(loop: DecodeLoop, method: str, error: BaseException | None = None) -> None:
    """Make the loop's *method* raise *error* (a bug) from its next call on."""

    def broken(*_args: object, **_kwargs: object) -> None:
        raise error or KeyError(f"a bug in {method}")

    setattr(loop, method, broken)


class TestABugAnywhereInTheLoop:
    """The guard around the whole loop: what it held ends with an error, the engine is lost, nothing hangs."""

    @staticmethod
    def assert_lost(run: Run, caplog: pytest.LogCaptureFixture, *, ended: set[int]) -> None:
        """The sequences in *ended* failed with a 500; the engine heard once; later work is refused."""
        run.wait()
        assert set(run.ended) == ended
        for error in run.ended.values():
            assert isinstance(error, EngineFailure)
            assert not error.fatal  # their requests get a 500: an engine bug, not a lost device
        assert len(run.lost) == 1
        assert run.lost[0].fatal
        critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert len(critical) == 1
        with pytest.raises(EngineFailure) as refused:
            run.loop.submit(run.sequence(3, prompt=2, generate=1), lambda _error: None)  # type: ignore[arg-type]
        assert refused.value.fatal
        for idle in (False, True):  # jobs are refused: they hear it at once, and never run
            refusal = run.post(lambda: pytest.fail("a job ran on a lost loop"), idle=idle)()
            assert isinstance(refusal, EngineFailure)
            assert refusal.fatal
        run.loop.schedule_idle(lambda: None)  # dropped
        thread = run.loop._thread
        assert run.loop.stop(WAIT_S)
        assert thread is not None
        assert not thread.is_alive()

    def test_in_admission(self, caplog: pytest.LogCaptureFixture) -> None:
        run = Run()
        run.generating(0)
        break_(run.loop, "_admit")
        run.submit(run.sequence(1, prompt=2, generate=3))
        self.assert_lost(run, caplog, ended={0, 1})

    def test_in_a_call(self, caplog: pytest.LogCaptureFixture) -> None:
        run = Run()
        run.generating(0)
        break_(run.loop, "_run_call")
        error = run.post(lambda: "saved")()
        assert isinstance(error, EngineFailure)
        self.assert_lost(run, caplog, ended={0})

    def test_in_idle_work(self, caplog: pytest.LogCaptureFixture) -> None:
        run = Run()
        break_(run.loop, "_run_idle")
        assert isinstance(run.post(lambda: None, idle=True)(), EngineFailure)
        run.wait()
        assert len(run.lost) == 1
        self.assert_lost(run, caplog, ended=set())

    def test_in_the_handler_of_a_failed_step(self, caplog: pytest.LogCaptureFixture) -> None:
        run = Run()
        run.generating(0)
        run.generating(1).close_error = RuntimeError("and its sampler cannot be freed")
        break_(run.loop, "_step_failed", RuntimeError("a bug in the handler"))
        break_(run.loop, "_step")
        self.assert_lost(run, caplog, ended={0, 1})

    def test_calls_and_arrivals_not_yet_taken_up_end_too(self, caplog: pytest.LogCaptureFixture) -> None:
        run = Run()
        run.generating(0)
        run.context.wedged = threading.Event()  # the loop's next turn takes everything queued meanwhile
        assert run.context.stuck.wait(WAIT_S)
        break_(run.loop, "_run_call")
        first, second = run.post(lambda: 1), run.post(lambda: 2)
        run.submit(run.sequence(1, prompt=2, generate=3), run.sequence(2, prompt=2, generate=3))
        with run.loop._inbox._wakeup:
            assert run.loop._inbox._wakeup.wait_for(lambda: len(run.loop._inbox._calls) == 2, timeout=WAIT_S)
        run.context.wedged.set()
        assert isinstance(first(), EngineFailure)
        assert isinstance(second(), EngineFailure)
        self.assert_lost(run, caplog, ended={0, 1, 2})


class TestJobs:
    """Work posted to the thread: when it runs, and that every job hears of its end once, run or not."""

    def test_a_job_runs_between_steps_and_hands_back_its_result(self) -> None:
        run = Run()
        streaming = run.generating(0)
        results: list[tuple[object, BaseException | None]] = []
        ended = threading.Event()

        def end(result: object, error: BaseException | None) -> None:
            results.append((result, error))
            ended.set()

        run.loop.post(Job(lambda: streaming.generated, ended=end))
        assert ended.wait(WAIT_S)
        assert results[0][1] is None
        assert isinstance(results[0][0], int)
        assert not streaming.done  # the stream went on around it
        run.close()

    def test_its_error_goes_to_its_poster_and_the_loop_serves_on(self) -> None:
        run = Run()
        assert isinstance(run.post(lambda: {}["missing"])(), KeyError)
        assert run.post(lambda: None)() is None
        assert run.lost == []
        run.close()

    def test_idle_work_runs_after_the_generations_and_the_idle_work_posted_before(self) -> None:
        run = Run()
        order: list[str] = []
        streaming = run.generating(0)
        run.loop.schedule_idle(lambda: order.append(f"warm-up, the stream over: {0 in run.ended}"))
        settled = run.post(lambda: order.append("settled"), idle=True)
        streaming.cancelled = True  # the stream ends; then the idle work runs, in order
        run.loop.wake()
        assert settled() is None
        assert order == ["warm-up, the stream over: True", "settled"]
        run.close()

    def test_a_withdrawn_job_never_runs(self) -> None:
        run = Run()
        run.generating(0)
        run.context.wedged = threading.Event()  # the loop's next turn takes everything queued meanwhile
        assert run.context.stuck.wait(WAIT_S)
        ran: list[int] = []
        heard: list[object] = []
        job = Job(lambda: ran.append(1), ended=lambda result, error: heard.append((result, error)))
        run.loop.post(job)
        assert job.withdraw()
        after = run.post(lambda: None)  # the loop's next turn takes both
        run.context.wedged.set()
        assert after() is None
        assert (ran, heard) == ([], [])
        assert not job.withdraw()  # withdrawn once
        run.close()

    @pytest.mark.parametrize("idle", [False, True])
    def test_a_loop_that_stops_ends_the_jobs_it_holds(self, idle: bool) -> None:
        run = Run()
        run.context.wedged = threading.Event()
        run.submit(run.sequence(0, prompt=2, generate=3))
        assert run.context.stuck.wait(WAIT_S)
        pending = run.post(lambda: pytest.fail("a job ran after stop"), idle=idle)
        try:
            assert not run.loop.stop(0)  # it is stuck: stop says so and does not wait
        finally:
            run.context.wedged.set()
        error = pending()
        assert isinstance(error, EngineFailure)
        assert not error.fatal  # closed, not lost
        assert run.loop.stop(WAIT_S)
        refused = run.post(lambda: None, idle=idle)()  # and later ones are refused
        assert isinstance(refused, EngineFailure)


class TestAStuckThread:
    """A thread stuck in llama.cpp cannot be ended; the waits on it are bounded instead."""

    def test_stop_says_when_it_did_not_stop(self) -> None:
        run = Run()
        run.context.wedged = threading.Event()
        run.submit(run.sequence(0, prompt=2, generate=3))
        assert run.context.stuck.wait(WAIT_S)
        try:
            assert not run.loop.stop(0.2)  # the context must not be freed under it
        finally:
            run.context.wedged.set()
        assert run.loop.stop(WAIT_S)
        run.wait()
        assert isinstance(run.ended[0], EngineFailure)  # closed while generating

    def test_its_courier_runs_until_the_thread_has_stopped(self) -> None:
        """The courier starts with the thread and stops after it (it carries the ends the thread delivers)."""
        before = set(threading.enumerate())
        run = Run()
        run.context.wedged = threading.Event()
        run.submit(run.sequence(0, prompt=2, generate=3))
        assert run.context.stuck.wait(WAIT_S)
        (courier,) = (t for t in set(threading.enumerate()) - before if t.name == "bubo-courier")
        try:
            assert not run.loop.stop(0.2)
            assert courier.is_alive()  # the stuck thread may still post
        finally:
            run.context.wedged.set()
        assert run.loop.stop(WAIT_S)
        assert not courier.is_alive()


def test_a_loop_never_started_starts_no_courier() -> None:
    before = set(threading.enumerate())
    run = Run()
    assert run.loop.stop(0)
    assert set(threading.enumerate()) == before


def refusing(name: str) -> Callable[[threading.Thread], None]:
    """``Thread.start`` for a machine with no thread to spare for the thread named *name*."""
    start = threading.Thread.start

    def start_but_that_one(thread: threading.Thread) -> None:
        if thread.name == name:
            raise RuntimeError("can't start new thread")
        start(thread)

    return start_but_that_one


def served(run: Run, *sequences: ScriptedSequence) -> None:
    """Submit *sequences* in one step, wait for all to end, and stop the loop."""
    try:
        run.submit(*sequences)
        run.wait()
    finally:
        run.close()


class TestTheCourier:
    """What the loop posts through its courier reaches trio in order, and never waits for a decode."""

    async def test_the_loss_reaches_trio_before_the_ends_it_carries(self) -> None:
        """The loss is posted (directly, as the engine does) before any end is handed to the courier."""
        token = trio.lowlevel.current_trio_token()
        posted: list[str] = []  # in the order the decode thread posted them
        heard: list[str] = []  # in the order trio ran them

        def post(label: str, send: Callable[..., None]) -> None:
            posted.append(label)
            send(token, heard.append, label)

        run = Run(on_lost=lambda _failure: post("lost", post_to_trio))
        run.context.failures.append(EngineFailure("llama_decode failed with status -3", fatal=True))
        sequence = run.sequence(0, prompt=2, generate=3)
        run.loop.submit(sequence, lambda _error: post("ended", run.loop.to_trio.post))  # type: ignore[arg-type]
        with trio.fail_after(WAIT_S):
            while len(heard) < 2:
                await trio.sleep(0.01)
        assert posted == heard == ["lost", "ended"]

    async def test_an_end_found_before_a_decode_reaches_trio_while_that_decode_hangs(self) -> None:
        """A client that left is let go at the step's start: its end goes out though the step's decode hangs."""
        token = trio.lowlevel.current_trio_token()
        heard: list[str] = []
        run = Run()
        run.generating(0)
        leaver = run.sequence(1, prompt=2, generate=10**9)
        generated = threading.Event()
        leaver.on_step = generated.set
        run.loop.submit(leaver, lambda _error: run.loop.to_trio.post(token, heard.append, "let go"))  # type: ignore[arg-type]
        assert await trio.to_thread.run_sync(generated.wait, WAIT_S)
        paused, resume = threading.Event(), threading.Event()
        run.post(lambda: (paused.set(), resume.wait(WAIT_S)))  # between two steps
        assert await trio.to_thread.run_sync(paused.wait, WAIT_S)
        leaver.cancelled = True  # let go at the next step's start,
        run.context.wedged = threading.Event()  # whose decode hangs
        resume.set()
        try:
            assert await trio.to_thread.run_sync(run.context.stuck.wait, WAIT_S)
            with trio.fail_after(WAIT_S):
                while not heard:
                    await trio.sleep(0.01)
            assert heard == ["let go"]
        finally:
            run.context.wedged.set()

    def test_a_loop_whose_courier_cannot_start_still_serves(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def refuse(_courier: Courier) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(Courier, "start", refuse)
        run = Run()
        run.submit(run.sequence(0, prompt=2, generate=3))
        run.wait()
        assert run.ended == {0: None}

    def test_a_decode_thread_that_cannot_start_refuses_the_work_and_a_later_request_starts_it(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        run = Run()
        refused_ended: list[BaseException | None] = []
        with monkeypatch.context() as patched:
            patched.setattr(threading.Thread, "start", refusing("bubo-decode"))
            with pytest.raises(EngineFailure, match="decode thread could not start"):
                run.loop.submit(run.sequence(0, prompt=2, generate=3), refused_ended.append)  # type: ignore[arg-type]
        run.submit(run.sequence(1, prompt=2, generate=3))
        run.wait()
        assert run.loop.stop(WAIT_S)
        assert run.ended == {1: None}
        assert refused_ended == []  # never queued: neither served nor ended by the stop


class TestATakeThatWaits:
    """A token whose take waits is settled beside the next step's decode, before anything else touches it."""

    def waiting(self, run: Run, slot: int, generate: int, **fields: object) -> ScriptedSequence:
        return attrs.evolve(run.sequence(slot, prompt=2, generate=generate), waits=True, **fields)

    def test_is_settled_on_the_thread_beside_while_the_next_decode_runs(self) -> None:
        run = Run(beside=Beside(name="test-beside"))
        sequence = self.waiting(run, 0, generate=5)
        settled_in_time: list[bool] = []

        def decoding() -> None:  # the decode waits for the settle: it runs beside, not after
            deadline = time.monotonic() + WAIT_S
            while sequence.unsettled and time.monotonic() < deadline:
                time.sleep(0.001)
            settled_in_time.append(not sequence.unsettled)

        run.context.while_decoding = decoding
        served(run, sequence)
        assert run.ended == {0: None}
        assert sequence.settled == ["test-beside"] * 4  # each generated token but the last
        assert all(settled_in_time)

    def test_without_a_thread_beside_is_settled_on_the_decode_thread(self) -> None:
        run = Run()
        sequence = self.waiting(run, 0, generate=3)
        served(run, sequence)
        assert sequence.settled == ["bubo-decode"] * 2

    def test_a_stop_found_late_ends_the_generation_with_its_token_decoded(self) -> None:
        run = Run(beside=Beside())
        stopped = self.waiting(run, 0, generate=100, stop_late_at=3)
        other = self.waiting(run, 1, generate=6)
        served(run, stopped, other)
        assert run.ended == {0: None, 1: None}
        assert stopped.finished_by is StopCause.STOP_WORD
        assert stopped.generated == 3  # nothing evaluated after the stop
        # its prompt, then a token a step: the third is settled (and ends it) in the step decoding it
        its_tokens = [sum(n for seq, n in batch if seq == 0) for batch in run.context.batches[:6]]
        assert its_tokens == [2, 1, 1, 1, 1, 0]
        assert stopped.settled == ["bubo-beside"] * 3

    def test_a_take_that_fails_fails_its_request_alone(self) -> None:
        run = Run(beside=Beside())
        failing = self.waiting(run, 0, generate=100, settle_error=RuntimeError("a bug in a take"))
        other = self.waiting(run, 1, generate=6)
        served(run, failing, other)
        assert isinstance(run.ended[0], RuntimeError)
        assert run.ended[1] is None
        assert failing.closed
        assert not failing.cache.tokens  # a bug may have left the sequence half-written

    def test_a_failed_decode_is_handled_after_the_tokens_are_settled(self) -> None:
        run = Run(beside=Beside())
        sequence = self.waiting(run, 0, generate=100)
        run.context.fail_once = lambda _entries: (
            EngineFailure("llama_decode failed with status 1") if sequence.generated == 3 else None
        )
        served(run, sequence)
        assert isinstance(run.ended[0], EngineFailure)
        assert sequence.generated == 3
        assert not sequence.unsettled  # its third token was taken before the failure ended it

    def test_a_loop_whose_thread_beside_cannot_start_takes_them_itself(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(threading.Thread, "start", refusing("bubo-beside"))
        run = Run(beside=Beside())
        sequence = self.waiting(run, 0, generate=3)
        served(run, sequence)
        assert run.ended == {0: None}
        assert sequence.settled == ["bubo-decode"] * 2

    def test_a_step_of_images_alone_takes_them_on_the_decode_thread(self) -> None:
        """Another adapter set's turn that holds only an image: no text decode to take them beside."""
        run = Run(chunk=4, beside=Beside())
        stream = self.waiting(run, 0, generate=6)
        reading = run.sequence(1, prompt=18, generate=1, adapters=((0, 1.0),))
        reading.image_at = 4  # its set's second turn: the stream has a token waiting by then
        served(run, stream, reading)
        assert run.ended == {0: None, 1: None}
        assert len(run.context.images) == 1
        assert stream.settled.count("bubo-decode") == 1  # the image's step
        assert stream.settled.count("bubo-beside") == len(stream.settled) - 1

    def test_a_full_context_after_a_late_stop_ended_the_whole_batch_takes_nothing_more(self) -> None:
        run = Run(beside=Beside())
        sequence = self.waiting(run, 0, generate=100, stop_late_at=2)
        run.context.fail_once = lambda _entries: (
            ContextFull("the KV cache is full") if sequence.generated == 2 else None
        )
        served(run, sequence)
        assert run.ended == {0: None}  # it ended by its stop string, not by the full context
        assert sequence.finished_by is StopCause.STOP_WORD
        assert sequence.cache.evicted == 0
