"""Work on one slot's KV sequence that runs on the decode thread: slot files and the next turn's warm-up.

Each function builds the job; the engine crosses it to the decode thread
(:mod:`._crossing`, between two steps of the other slots) or queues it as
idle work.  They touch the context, so they run only there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from bubo.domain.generation import GenerationRequest, StopCause

from ._context import LlamaContext
from ._generation import Outcome
from ._kv import saved_token_count
from .base import EngineFailure, SlotFile, SlotFileNoRoom
from .lora import adapter_set
from .slots import Slot

__all__ = ["erase_job", "restore_job", "save_job", "warm_up_job"]


def save_job(context: LlamaContext, slot: Slot, path: Path) -> Callable[[], SlotFile]:
    """Write *slot*'s sequence to *path*."""
    cache = context.caches[slot.id]

    def save() -> SlotFile:
        n_bytes = cache.save_file(path)  # first: it drops the cells a context shift moved
        slot.holds(len(cache.tokens))
        return SlotFile(n_tokens=len(cache.tokens), n_bytes=n_bytes, adapters=cache.adapters)

    return save


def restore_job(
    context: LlamaContext, slot: Slot, path: Path, scales: Sequence[float]
) -> Callable[[], SlotFile]:
    """Read *path* into *slot*'s sequence, taken as computed under the adapter *scales* in force now.

    The job raises :class:`SlotFileNoRoom` (a 503 to retry) when the file would
    fit a slot but the context the slots share has no room for it now.
    """
    cache = context.caches[slot.id]

    def restore() -> SlotFile:
        try:
            n_bytes = cache.load_file(path, context.n_ctx_seq)
        except EngineFailure:
            needed = saved_token_count(path)
            room = context.n_ctx - context.cells_used
            shared = context.n_ctx_seq == context.n_ctx and len(context.caches) > 1
            if shared and needed is not None and room < needed <= context.n_ctx_seq:
                raise SlotFileNoRoom(
                    f"{path.name} holds {needed} tokens; the context the slots share has room for "
                    f"{room} now: retry when other requests have finished"
                ) from None
            raise
        cache.adapters = adapter_set(scales)
        slot.holds(len(cache.tokens))
        return SlotFile(n_tokens=len(cache.tokens), n_bytes=n_bytes, adapters=cache.adapters)

    return restore


def erase_job(context: LlamaContext, slot: Slot) -> Callable[[], int]:
    """Empty *slot*'s sequence; the job returns the tokens it held."""
    cache = context.caches[slot.id]

    def erase() -> int:
        n_tokens = len(cache.tokens)
        cache.clear()
        return n_tokens

    return erase


def warm_up_job(
    context: LlamaContext, slot: Slot, request: GenerationRequest, outcome: Outcome, eog: frozenset[int]
) -> Callable[[], None] | None:
    """Evaluating the end of turn the next prompt will start with, or None where it would not be read.

    Built on the decode thread as the generation ends (so a client that leaves
    right after its last token still gets its next turn warm), run once no
    generation is active.  Only after an answer the client will send back as
    it is (it ended, or hit its token limit): then the next turn's prompt
    continues with the last generated token and the template's end of turn.
    A request that uses the slot first makes the job stale, and it does nothing.
    """
    if (
        not request.continuation
        or outcome.shifted  # the next prompt cannot reuse a shifted sequence
        or outcome.cause not in (StopCause.EOS, StopCause.LIMIT)
    ):
        return None
    last = outcome.undecoded
    tokens = ((last,) if last is not None and last not in eog else ()) + request.continuation
    cache = context.caches[slot.id]
    if len(cache.tokens) + len(tokens) >= context.n_ctx_seq:
        return None
    version = cache.version

    def warm_up() -> None:  # on the decode thread, with no generation active
        if cache.version != version:  # another request used the slot
            return
        context.decode(tokens, cache.seq_id)
        slot.holds(len(cache.tokens))

    return warm_up
