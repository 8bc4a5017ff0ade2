"""The decode loop's scheduling and failure handling, with a scripted context and scripted sequences.

What goes into each batch (every generating token, then prompt chunks up to the
chunk size, oldest first), who ends when a decode fails, and how a full shared
KV cache is made room in; the real engine's behaviour is in test_parallel.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

from bubo.domain.generation import StopCause
from bubo.engine._context import BatchEntry, ContextFull
from bubo.engine._decode_loop import DecodeLoop
from bubo.engine.base import EngineFailure
from bubo.errors import ServiceUnavailable

WAIT_S = 10


@attrs.define(eq=False)
class ScriptedCache:
    seq_id: int
    tokens: list[int] = attrs.field(factory=list)
    evicted: int = 0

    def evict(self) -> None:
        self.evicted += 1
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

    def decode_batch(self, entries: list[BatchEntry]) -> list[int]:
        if self.failures:
            raise self.failures.pop(0)
        failure = self.fail_once(entries) if self.fail_once is not None else None
        if failure is not None:
            self.fail_once = None
            raise failure
        self.batches.append([(entry.cache.seq_id, len(entry.tokens)) for entry in entries])
        starts, at = [], 0
        for entry in entries:
            starts.append(at)
            at += len(entry.tokens)
            entry.cache.tokens.extend(entry.tokens)
        return starts


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

    @property
    def prefilling(self) -> bool:
        return self.read < self.prompt

    def start(self) -> None:
        pass

    def prompt_entry(self, room: int) -> BatchEntry:
        return BatchEntry(self.cache, (1,) * min(room, self.prompt - self.read))  # type: ignore[arg-type]

    def token_entry(self, *, alone: bool) -> BatchEntry:
        return BatchEntry(self.cache, (2,))  # type: ignore[arg-type]

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        if self.prefilling:
            self.read += len(entry.tokens)
        else:
            self.generated += 1
        if self.on_step is not None:
            self.on_step()
        if self.generated >= self.generate:
            self.done = True

    def finish(self, cause: StopCause) -> None:
        self.finished_by = cause
        self.done = True

    def close(self) -> None:
        self.closed = True


class Run:
    """A loop over a scripted context; ``join`` submits sequences and waits for all to end."""

    def __init__(self, n_slots: int = 4, chunk: int = 8) -> None:
        self.context = ScriptedContext(tuple(ScriptedCache(i) for i in range(n_slots)))
        self.loop = DecodeLoop(self.context, prefill_chunk=chunk, drafting=None)  # type: ignore[arg-type]
        self.ended: dict[int, BaseException | None] = {}
        self._done: dict[int, threading.Event] = {}

    def sequence(self, slot: int, prompt: int, generate: int) -> ScriptedSequence:
        return ScriptedSequence(self.context.caches[slot], prompt, generate)

    def submit(self, *sequences: ScriptedSequence) -> None:
        """Submit *sequences* so that the loop takes them in the same step."""
        with self.loop._wakeup:  # reentrant: the loop waits until all are in
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
    assert run.context.batches[0] == [(0, 4), (1, 4)]  # the chunk is shared, oldest prompt first
    for batch in run.context.batches:
        assert sum(n for _, n in batch if n > 1) <= 8  # prompt tokens: at most a chunk a step
    generating = run.context.batches[1:13]  # slot 0's twelve tokens, one a step
    assert all((0, 1) in batch for batch in generating)
    assert any(seq == 1 and n > 1 for batch in generating for seq, n in batch)  # while prompts were read
    # the older prompt is read first: slot 2's chunks start once slot 1's prompt is in
    first_of_2 = next(i for i, batch in enumerate(run.context.batches) if any(s == 2 for s, _ in batch))
    read_by_1 = sum(n for batch in run.context.batches[:first_of_2] for s, n in batch if s == 1)
    assert read_by_1 >= 30 - 8
    assert run.ended == {0: None, 1: None, 2: None}


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
        assert isinstance(refused, ServiceUnavailable)
        assert refused.code == "context_full"
        assert run.ended[0] is None
        assert old.generated == 30

    def test_with_every_sequence_generating_the_longest_ends_as_at_the_context_end(self) -> None:
        run = Run()
        short, long = run.sequence(0, prompt=2, generate=50), run.sequence(1, prompt=20, generate=50)
        run.context.fail_once = lambda _: ContextFull("no room") if short.generated == 5 else None
        try:
            run.submit(short, long)
            run.wait()
        finally:
            run.close()
        assert long.finished_by is StopCause.CONTEXT
        assert run.context.caches[1].evicted == 1
        assert run.ended == {0: None, 1: None}
        assert short.generated == 50
