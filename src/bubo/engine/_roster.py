"""The generations the decode thread holds, and the one way each of them ends.

A generation crosses from trio with its ``ended`` callback (a :class:`Member`);
the :class:`Roster` admits it, keeps it while it is active and calls ``ended``
exactly once when the loop lets go of it: finished, failed, cancelled, or ended
by the loop's guard (:attr:`Member.over` marks an end delivered, so the guard
never delivers one twice).

:meth:`Roster.evaluated` is the one place a decoded step reaches a
generation: the generation samples its next token there and does that token's
bookkeeping (stops, events, the draft walk), and the roster hands it back to
trio once it ended.  A token whose bookkeeping waits (``unsettled``) is
settled in the next step, beside its ``llama_decode`` (:class:`Settling`):
:meth:`Roster.settling` gathers those tokens, :meth:`Settling.run` takes them
(touching only each generation's own parts), and :meth:`Roster.settled` hands
back, on the decode thread, the generations that ended or failed there.  A
fatal failure (:meth:`Roster.lose`) is remembered: every later arrival ends
with it, and the engine hears of it once.

Decode thread only (:meth:`Settling.run` may run on another while the decode
thread waits in ``llama_decode``); written against :class:`ActiveGeneration`,
so it runs with scripted generations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from bubo.domain.generation import StopCause

from ._protocols import BatchEntry, KvSequence
from .errors import EngineError, EngineFailure
from .lora import AdapterSet

__all__ = ["ActiveGeneration", "Ended", "Member", "Roster", "Settling"]

logger = logging.getLogger(__name__)

Ended = Callable[[BaseException | None], None]
"""Called on the decode thread once the loop lets go of a generation: with its error, or None."""


class ActiveGeneration(Protocol):
    """What the loop asks of a generation (``_generation.Generation``), on the decode thread."""

    cancelled: bool  # set on the trio thread: let go of it at the next step

    @property
    def cache(self) -> KvSequence:
        """The slot's KV sequence it writes."""
        ...

    @property
    def done(self) -> bool:
        """Whether it ended."""
        ...

    @property
    def adapters(self) -> AdapterSet:
        """The LoRA adapter set it decodes under."""
        ...

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to evaluate."""
        ...

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to evaluate."""
        ...

    @property
    def unsettled(self) -> bool:
        """Whether its last sampled token's bookkeeping waits for :meth:`settle`."""
        ...

    def start(self) -> None:
        """Reuse the cached prefix and build the sampler (raises the request's own failure)."""
        ...

    def prompt_entry(self, room: int) -> BatchEntry:
        """Up to *room* prompt tokens for the next batch."""
        ...

    def token_entry(self, *, alone: bool) -> BatchEntry:
        """The token to evaluate next (and a draft, when *alone* in the batch)."""
        ...

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*."""
        ...

    def settle(self) -> None:
        """Do the bookkeeping of its last sampled token."""
        ...

    def finish(self, cause: StopCause) -> None:
        """End it now, for *cause*."""
        ...

    def close(self) -> None:
        """Free what it holds (it ended, failed or was let go of)."""
        ...


@attrs.define(eq=False)
class Member:
    """A generation the loop was given, and who hears of its end."""

    generation: ActiveGeneration
    ended: Ended
    over: bool = False  # its end was delivered (or is being delivered): never twice
    served: int = -1  # the last step it was in (the adapter sets take turns by it)


@attrs.define(eq=False)
class Settling:
    """One step's unsettled tokens: their generations' bookkeeping, to run beside the step's decode."""

    members: list[Member]
    failures: list[tuple[Member, Exception]] = attrs.Factory(list)

    def run(self) -> None:
        """Settle each generation (touching only its own parts: any thread while the decode runs)."""
        for member in self.members:
            try:
                member.generation.settle()
            except Exception as error:  # noqa: BLE001 - a bug fails its own request only (in settled)
                self.failures.append((member, error))


class Roster:
    """The active generations of one decode loop, in the order they were admitted."""

    def __init__(self, on_lost: Callable[[EngineFailure], None]) -> None:
        """*on_lost* is called once, on the decode thread, with the first fatal failure."""
        self.members: list[Member] = []
        self._on_lost = on_lost
        self._fatal: EngineFailure | None = None
        self._nothing_to_settle = Settling([])  # most steps' (made once: it never runs anything)

    def seq_ids(self) -> set[int]:
        """The KV sequences the active generations write."""
        return {member.generation.cache.seq_id for member in self.members}

    def admit(self, member: Member) -> None:
        """Start *member*'s generation and keep it, or end it now (cancelled, engine lost, own failure)."""
        if member.generation.cancelled:
            self.end(member, None)
            return
        if self._fatal is not None:
            self.end(member, self._fatal)
            return
        try:
            member.generation.start()
        except Exception as error:  # noqa: BLE001 - the request's own failure (a grammar, a prompt)
            member.generation.close()
            self.end(member, error)
            return
        self.members.append(member)

    def lose(self, failure: EngineFailure) -> None:
        """A fatal failure: every later generation is refused with it, and the engine hears once."""
        if self._fatal is None:
            self._fatal = failure
            self._on_lost(failure)

    def drop_cancelled(self) -> None:
        """Let go of the generations whose clients left."""
        for member in [m for m in self.members if m.generation.cancelled]:
            member.generation.close()
            self.members.remove(member)
            self.end(member, None)

    def evaluated(self, member: Member, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*: *member* takes its result; handed over once ended."""
        try:
            member.generation.evaluated(entry, index)
        except Exception as error:  # noqa: BLE001 - a bug fails its own request only
            self.fail(member, error)
            return
        if member.generation.done:
            self.members.remove(member)
            self.end(member, None)

    def settling(self) -> Settling:
        """The active generations' unsettled tokens."""
        unsettled = [member for member in self.members if member.generation.unsettled]
        return Settling(unsettled) if unsettled else self._nothing_to_settle

    def settled(self, settling: Settling) -> None:
        """*settling* ran: hand over the generations it ended, fail those it failed (decode thread)."""
        for member, error in settling.failures:
            self.fail(member, error)
        for member in settling.members:
            if member.generation.done and not member.over:
                self.members.remove(member)
                self.end(member, None)

    def reached_context_end(self, member: Member) -> None:
        """*member* alone filled the context: it ends as at the context's end (``length``)."""
        member.generation.finish(StopCause.CONTEXT)
        self.members.remove(member)
        self.end(member, None)

    def fail(self, member: Member, error: BaseException) -> None:
        """End *member* with *error* (its sequence forgotten unless the error is a known one)."""
        member.generation.close()
        if not isinstance(error, EngineError):
            member.generation.cache.clear()  # a bug may have left the sequence half-written
        if member in self.members:
            self.members.remove(member)
        self.end(member, error)

    def end_all(self, error: BaseException, *, arrivals: Iterable[Member] = ()) -> None:
        """End every active generation, and the *arrivals* never admitted, with *error*."""
        members, self.members = [*self.members, *arrivals], []
        for member in members:
            member.generation.close()
            self.end(member, error)

    def abandon(self, arrivals: Iterable[Member], error: BaseException) -> None:
        """The loop's guard: end every generation held or arriving whose end was not delivered yet.

        Each end is delivered whatever happens to the others: this runs after
        a bug, so nothing here may rely on the state it left.
        """
        members = [m for m in dict.fromkeys([*self.members, *arrivals]) if not m.over]
        self.members = []
        for member in members:
            try:
                member.generation.close()
            except Exception:  # noqa: BLE001, S110 - its sampler leaks; the end is still delivered
                pass
            finally:
                try:
                    self.end(member, error)
                except Exception:
                    logger.exception("a generation's end could not be delivered")

    @staticmethod
    def end(member: Member, error: BaseException | None) -> None:
        """Deliver *member*'s end (its ``ended`` callback), marking it over first."""
        member.over = True
        member.ended(error)
