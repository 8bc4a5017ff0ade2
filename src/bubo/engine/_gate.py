"""The slots' gate: a generation waits for a slot (FIFO), runs its producer, and gives the slot back.

Cancellation story (see ``docs/design.md``): a request opens a generation with
``async with engine.open_generation(request) as events``.  Waiting for a slot
is waiting in the :class:`~.slots.SlotPool`'s FIFO queue; a client that leaves
while queued is simply cancelled out of that wait and never touches a running
generation.  Once a slot is held, the producer (a sequence on the llama.cpp
engine's decode thread, a task for the fake engine) runs in a nursery and sends
events through a memory channel.  Leaving the ``async with`` block, for any
reason, cancels the producer; the decode thread drops the sequence at its next
step, and the slot is given back only then.  An interruption (shutdown's
deadline, :meth:`~._life.EngineLife.interrupt`) cancels the waits and the
producers the same way, then hands each its error: waiting requests raise it,
running ones get it as their last event, so every dialect can report it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from bubo.domain.generation import EngineEvent, GenerationFailed, GenerationRequest

from ._life import EngineLife
from .lora import adapter_set
from .slots import Slot, SlotPool

__all__ = ["GenerationGate", "Producer"]

Producer = Callable[[Slot, GenerationRequest, trio.MemorySendChannel[EngineEvent]], Awaitable[None]]
"""Runs one generation while its slot is held, sending its events (it need not close the channel)."""


class GenerationGate:
    """Admits generations to the slots of *pool* and runs each one's producer (trio thread)."""

    def __init__(self, pool: SlotPool, life: EngineLife, produce: Producer, *, channel_buffer: float) -> None:
        """*channel_buffer*: the events a producer may run ahead of its consumer."""
        self._pool = pool
        self._life = life
        self._produce = produce
        self._channel_buffer = channel_buffer
        self._next_task_id = 0

    @asynccontextmanager
    async def open(self, request: GenerationRequest) -> AsyncIterator[trio.MemoryReceiveChannel[EngineEvent]]:
        """Wait for a slot (FIFO), then stream the generation's events (*request*'s scales settled).

        Raises:
            Lost: the engine was lost (before or while this request waited).
            Exception: the engine was interrupted (before or while this request waited): its error.

        """
        slot = await self._acquire_slot(request)
        try:
            self._life.check_usable()
            task_id = self._next_task_id
            self._next_task_id += 1
            send, receive = trio.open_memory_channel[EngineEvent](self._channel_buffer)
            with receive, _unwrap_single_error():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._run_producer, slot, task_id, request, send)
                    try:
                        yield receive
                    finally:
                        # Whether the consumer read everything or left early, the
                        # producer must stop now; a finished producer ignores this.
                        nursery.cancel_scope.cancel()
        finally:
            self._pool.release(slot)

    async def _acquire_slot(self, request: GenerationRequest) -> Slot:
        """Wait for a slot; an interruption meanwhile raises its error instead."""
        slot = None
        with self._life.interruptible():
            slot = await self._pool.acquire(
                request.prompt_tokens, request.slot, adapter_set(request.lora or ())
            )
        if slot is None:  # only an interruption cancels this scope
            raise self._life.ending()
        return slot

    async def _run_producer(
        self,
        slot: Slot,
        task_id: int,
        request: GenerationRequest,
        send: trio.MemorySendChannel[EngineEvent],
    ) -> None:
        slot.begin(
            task_id, request.max_new_tokens, request.lora or (), prompt_length=len(request.prompt_tokens)
        )
        try:
            async with send:
                failure = None
                with self._life.interruptible() as running:
                    try:
                        await self._produce(slot, request, send)
                    except Exception as error:  # noqa: BLE001 - delivered to the consumer, not lost
                        failure = self._life.failure(
                            error
                        )  # sent outside the scope an interruption cancelled
                if failure is not None:
                    await send.send(GenerationFailed(error=failure))
                elif running.cancelled_caught and self._life.ended:
                    await send.send(GenerationFailed(error=self._life.ending()))
        finally:
            slot.end()


class _unwrap_single_error:  # noqa: N801 - used like a function, as contextlib helpers are
    """Let the one real error out of a one-producer nursery's ExceptionGroup.

    The nursery around a generation holds exactly one background task, so its
    strict ExceptionGroup has at most one error that is not ``Cancelled`` (the
    producer's, or the consumer's).  Callers expect that error itself, e.g. an
    :class:`~.errors.EngineFailure` for the dialect's error envelope.  A group
    of only ``Cancelled`` is left alone for trio's cancel scopes to absorb.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if not isinstance(exc, BaseExceptionGroup):
            return
        _, errors = exc.split(trio.Cancelled)
        if errors is None:
            return
        leaves = _leaves(errors)
        if len(leaves) == 1:
            raise leaves[0]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out
