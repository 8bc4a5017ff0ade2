"""Which cached cells a prompt starts from: the prompt cache's choice, over plain values.

A slot's sequence can take a prompt's prefix from five places: its own live
cells, another slot's sequence (a unified cache shares cells), a host-RAM
snapshot, a snapshot file read from disk for this request, and with
``--cache-reuse`` runs of its cached cells moved to their place after a changed
middle.  :func:`choose_source` decides among them from what each holds (token
ids and the LoRA adapter set the cells were computed under) and returns a
:class:`Plan`; :meth:`._kv.SequenceCache.prepare` carries it out with the
``llama_memory_*`` and ``llama_state_seq_*`` calls.  :func:`file_pays` decides
earlier, in a worker thread, whether a file is worth reading for the prompt
at all.  Nothing here calls llama.cpp or keeps state, so every rule is tested
without a model.

The rules, in order:

- Without reuse (``cache_prompt: false``) nothing is reused; the live sequence
  is still kept as a snapshot.
- Only cells computed under the request's adapter set count, and only a
  prompt's prefix up to its last token (sampling needs that token's logits).
- "Here" is the longer of the live prefix and the longest prefix another
  sequence may share (its first ``usable`` cells: exact and in place).
- The disk offer is restored when it matches more than the best snapshot
  (a snapshot wins a tie) and at least :data:`MIN_RESTORE_GAIN` more than
  here; else the best snapshot (the least recently used of equals) when it
  matches that much more than here; else the live sequence stays.
- The live sequence is saved first whenever it is replaced by a restore or
  would lose :data:`MIN_SNAPSHOT_TOKENS` tokens or more.
- Then another sequence's prefix (the first of equals) extends the kept one
  when it is longer; else, with ``reuse_chunk`` above 0 and a sequence that
  can move cells, the runs of ``reuse_chunk`` or more cached tokens the prompt
  goes on with are moved into place (never a cell before ``pinned``, which
  another sequence holds too).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import attrs

from .lora import NO_ADAPTERS, AdapterSet
from .slots import common_prefix

__all__ = [
    "MIN_RESTORE_GAIN",
    "MIN_SNAPSHOT_TOKENS",
    "Base",
    "DiskOffer",
    "Held",
    "Move",
    "Plan",
    "Share",
    "Sources",
    "choose_source",
    "chunk_moves",
    "file_pays",
]

MIN_SNAPSHOT_TOKENS = 64
"""A snapshot must save at least this many tokens of prefill to be worth its copy."""
MIN_RESTORE_GAIN = 32
"""How much longer a restored state's match must be than what the sequences hold already."""


@attrs.frozen
class Held:
    """Tokens a source holds, the adapter set their cells were computed under, and how many may be reused.

    ``usable`` bounds the reusable leading cells (``None``: all): another sequence
    offers only its exact, unmoved ones.  The tokens are read, never kept.
    """

    tokens: Sequence[int]
    adapters: AdapterSet = NO_ADAPTERS
    usable: int | None = None

    def match(self, prompt: Sequence[int], adapters: AdapterSet) -> int:
        """The prefix of *prompt* it may give a request under *adapters* (never the prompt's last token)."""
        if self.adapters != adapters:
            return 0
        limit = len(prompt) - 1
        return common_prefix(self.tokens, prompt, limit if self.usable is None else min(limit, self.usable))


@attrs.frozen(eq=False)
class DiskOffer:
    """A snapshot file read and checked for one request, handed to that request's generation alone.

    Read in a worker thread before the generation is submitted; the decode
    thread gets it with the generation (never through shared state) and
    restores it if :func:`choose_source` still picks it.
    """

    tokens: tuple[int, ...]
    adapters: AdapterSet
    payload: bytearray


class Base(enum.Enum):
    """Whose cells the sequence starts from."""

    LIVE = "live"  # its own
    SNAPSHOT = "snapshot"  # a host-RAM snapshot, restored
    DISK = "disk"  # the disk offer, restored


@attrs.frozen
class Share:
    """Take sequence *seq_id*'s cells from the kept prefix's end up to *end* (shared, not copied)."""

    seq_id: int
    end: int


@attrs.frozen
class Move:
    """Cached cells ``[start, end)`` move to ``to`` (< start); the cells in ``[to, start)`` go first."""

    start: int
    end: int
    to: int


@attrs.frozen(kw_only=True)
class Sources:
    """What each source holds for one prompt.

    ``live``: the sequence's exact cells; ``pinned``: the end of the last of them another
    sequence holds too.  ``peers``: the other sequences by id, ``usable`` their shareable
    cells.  ``snapshots``: host RAM's, by key, least recently used first.  ``offer``: the
    file read from disk for this request.  ``can_shift``: whether the memory can move cells.
    """

    live: Held
    pinned: int = 0
    peers: Sequence[tuple[int, Held]] = ()
    snapshots: Sequence[tuple[int, Held]] = ()
    offer: Held | None = None
    can_shift: bool = True


@attrs.frozen(kw_only=True)
class Plan:
    """What :meth:`._kv.SequenceCache.prepare` does for one prompt, in this order.

    Save the live sequence (``save_live``), restore ``base`` (snapshot
    ``snapshot_key``, or the disk offer), keep its first ``keep`` cells, then
    either take ``share`` or make ``moves`` (dropping the cells after the
    last), and so hold ``n_cached`` tokens of the prompt.  ``skipped`` counts
    the snapshots that shared a prefix and were not restored (the report's).
    ``disabled``: the request asked for no reuse.
    """

    base: Base = Base.LIVE
    snapshot_key: int | None = None
    save_live: bool = False
    keep: int = 0
    share: Share | None = None
    moves: tuple[Move, ...] = ()
    skipped: int = 0
    disabled: bool = False

    @property
    def n_cached(self) -> int:
        """Prompt tokens the sequence holds once the plan is carried out (every call succeeding)."""
        if self.share is not None:
            return self.share.end
        if self.moves:
            last = self.moves[-1]
            return last.to + last.end - last.start
        return self.keep


def chunk_moves(
    cached: Sequence[int], prompt: Sequence[int], keep: int, *, pinned: int, chunk: int
) -> tuple[Move, ...]:
    """``--cache-reuse``: the runs of *cached* after its first *keep* tokens that *prompt* goes on with.

    Walking the cache from ``max(keep, pinned)`` and the prompt from *keep*: a run
    of *chunk* or more equal tokens moves to the prompt's position and both walks
    pass it; otherwise the cached token is skipped.  The prompt's last token is
    never covered.  Cells before *pinned* (another sequence holds them) never move.
    """
    limit = len(prompt) - 1
    at_cache, at_prompt = max(keep, pinned), keep
    moves: list[Move] = []
    while at_cache < len(cached) and at_prompt < limit:
        run = 0
        while (
            at_cache + run < len(cached)
            and at_prompt + run < limit
            and cached[at_cache + run] == prompt[at_prompt + run]
        ):
            run += 1
        if run < chunk:
            at_cache += 1
            continue
        moves.append(Move(at_cache, at_cache + run, at_prompt))
        at_cache += run
        at_prompt += run
    return tuple(moves)


def _best(
    candidates: Sequence[tuple[int, Held]], prompt: Sequence[int], adapters: AdapterSet
) -> tuple[int | None, int, int]:
    """``(key, match, others)``: the first candidate with the longest match, and how many others matched."""
    best_key, best_len, others = None, 0, 0
    for key, held in candidates:
        match = held.match(prompt, adapters)
        if match > best_len:
            others += best_key is not None
            best_key, best_len = key, match
        elif match > 0:
            others += 1
    return best_key, best_len, others


def file_pays(prompt: Sequence[int], adapters: AdapterSet, file_match: int, held: Iterable[Held]) -> bool:
    """Whether a file sharing *file_match* tokens with *prompt* is worth reading (a request under *adapters*).

    It must beat every source in *held* (the slots' sequences and host RAM's
    snapshots) by :data:`MIN_RESTORE_GAIN` tokens: reading and checking a file
    costs more than restoring a snapshot already in memory.
    """
    here = max((source.match(prompt, adapters) for source in held), default=0)
    return file_match >= here + MIN_RESTORE_GAIN


def choose_source(
    prompt: Sequence[int], adapters: AdapterSet, sources: Sources, *, reuse: bool = True, reuse_chunk: int = 0
) -> Plan:
    """The plan that gives *prompt* (under *adapters*) the longest cached prefix, by the module's rules.

    *reuse* false: the request asked for none.  *reuse_chunk*: ``--cache-reuse``'s
    shortest run to move (0: off).
    """
    if not reuse:
        return Plan(save_live=True, disabled=True)
    live = sources.live
    live_match = live.match(prompt, adapters)
    peer_id, peer_match, _ = _best(sources.peers, prompt, adapters)
    snapshot_key, snapshot_match, skipped = _best(sources.snapshots, prompt, adapters)
    offer = sources.offer
    offer_match = offer.match(prompt, adapters) if offer is not None else 0
    here = max(live_match, peer_match)
    if offer is not None and offer_match > snapshot_match and offer_match >= here + MIN_RESTORE_GAIN:
        base, keep, cached, pinned = Base.DISK, offer_match, offer.tokens, 0
    elif snapshot_key is not None and snapshot_match >= here + MIN_RESTORE_GAIN:
        cached = dict(sources.snapshots)[snapshot_key].tokens
        base, keep, pinned = Base.SNAPSHOT, snapshot_match, 0  # a restored sequence's cells are its own
    else:  # the best snapshot counts as skipped here only, not where the disk offer beat it
        skipped += snapshot_key is not None
        base, keep, cached, pinned = Base.LIVE, live_match, live.tokens, sources.pinned
    plan = Plan(
        base=base,
        snapshot_key=snapshot_key if base is Base.SNAPSHOT else None,
        save_live=base is not Base.LIVE or len(live.tokens) - live_match >= MIN_SNAPSHOT_TOKENS,
        keep=keep,
        skipped=skipped,
    )
    if peer_id is not None and peer_match > keep:
        return attrs.evolve(plan, share=Share(peer_id, peer_match))
    base_adapters = live.adapters if base is Base.LIVE else adapters
    if reuse_chunk > 0 and base_adapters == adapters and sources.can_shift:
        return attrs.evolve(plan, moves=chunk_moves(cached, prompt, keep, pinned=pinned, chunk=reuse_chunk))
    return plan
