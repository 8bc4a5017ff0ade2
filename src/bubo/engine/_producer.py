"""One generation's way across to the decode thread and back: the llama.cpp engine's producer.

The trio task submits the request's :class:`~._generation.Generation` to the
current load's decode loop and waits for its end; the decode thread hands
each event to the request's own trio run through the loop's courier, or
directly (:attr:`~._decode_loop.DecodeLoop.to_trio`), in order and before the
end.  A client that leaves marks the generation cancelled and waits,
bounded, for the thread to let go of it (*released*, the engine's: past its
bound the engine is lost).  As the generation ends
well, the decode thread queues the next turn's warm-up and the sequence's
trip to the disk tier as idle work.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import trio

from bubo.domain.generation import EngineEvent, GenerationRequest

from ._backlog import EventBacklog, backlog_limit
from ._disk_cache import DiskTier
from ._generation import Generation, Outcome
from ._kv_plan import DiskOffer
from ._loaded import LoadedModel
from ._sequence_jobs import warm_up_job
from .lora import adapter_set
from .slots import Slot

__all__ = ["produce"]

logger = logging.getLogger(__name__)


async def produce(
    loaded: LoadedModel,
    slot: Slot,
    request: GenerationRequest,
    send: trio.MemorySendChannel[EngineEvent],
    *,
    disk: DiskTier | None,
    backlog_bytes: int,
    released: Callable[[trio.Event], Awaitable[None]],
) -> None:
    """Run *request* in *slot* on *loaded*'s decode thread, its events into *send*.

    *backlog_bytes* bounds the events its client has not read; *released*
    waits for the thread to let go of a cancelled generation (its *ended*).

    Raises:
        Exception: the generation's failure, or the backlog's :class:`~._backlog.StreamNotRead`.

    """
    loop = loaded.loop
    to_trio = loop.to_trio
    trio_token = trio.lowlevel.current_trio_token()  # this request's run hears its events

    def let_go() -> None:  # on the trio thread: the client left too many events unread
        generation.cancelled = True
        loop.wake()

    backlog = EventBacklog(send, limit=backlog_limit(request.n_probs, backlog_bytes), end=let_go)

    def emit(event: EngineEvent) -> None:  # on the decode thread (or beside it, as a token is taken)
        to_trio.post(trio_token, backlog.deliver, event)  # FIFO, before the generation's end

    offer = await _read_from_disk(loaded, disk, slot, request)
    make = functools.partial(Generation, loaded.setup, slot, request, emit=emit, offer=offer)
    # its stop strings' automaton is built with it: in a worker thread, off the event loop
    generation = await trio.to_thread.run_sync(make) if request.stop else make()
    ended = trio.Event()
    failures: list[BaseException] = []

    def on_end(error: BaseException | None) -> None:  # on the decode thread
        try:
            if error is not None:
                failures.append(error)
            elif generation.outcome is not None:
                _warm_up_later(loaded, slot, request, generation.outcome)
                if disk is not None:
                    loop.schedule_idle(loaded.context.caches[slot.id].persist)
        finally:
            to_trio.post(trio_token, ended.set)  # whatever happened above: the producer must hear

    loop.submit(generation, on_end)
    try:
        await ended.wait()
    finally:
        if not ended.is_set():  # the client left, or shutdown's deadline passed
            generation.cancelled = True
            loop.wake()
            await released(ended)
    if failures:
        raise failures[0]
    if backlog.overflowed and not generation.done:
        raise backlog.error()


async def _read_from_disk(
    loaded: LoadedModel, disk: DiskTier | None, slot: Slot, request: GenerationRequest
) -> DiskOffer | None:
    """The best snapshot file for the prompt, read and checked, if it beats host RAM and the slots.

    In a worker thread (reading and checking a file takes milliseconds to seconds).  The
    offer goes to the request's own generation, and the decode thread restores it when
    the generation starts, if it is still the best source.
    """
    if disk is None or not request.cache_prompt or not disk.total_bytes:
        return None
    context = loaded.context
    return await trio.to_thread.run_sync(
        context.caches[slot.id].read_from_disk,
        request.prompt_tokens,
        context.n_ctx_seq,
        adapter_set(request.lora or ()),
    )


def _warm_up_later(loaded: LoadedModel, slot: Slot, request: GenerationRequest, outcome: Outcome) -> None:
    """Queue the next turn's warm-up (on the decode thread); a failure costs only the warm-up."""
    try:
        job = warm_up_job(loaded.context, slot, request, outcome, loaded.setup.eog)
        if job is not None:
            loaded.loop.schedule_idle(job)
    except Exception:
        logger.exception("the next turn's warm-up could not be queued; it starts cold")
