"""DRY ("don't repeat yourself") stages: what one is built from, and the built ones kept across requests.

Building a DRY stage matches every sequence breaker against the whole
vocabulary, which takes up to seconds; :class:`DryStages` builds each setting
once, on a request's worker thread, and the decode thread clones it
(:mod:`._sampler`).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import llama_cpp

from bubo.domain.sampling import SamplingParams

from .errors import EngineFailure

__all__ = ["DryKey", "DryStages", "dry_key", "look_back", "new_dry_stage"]


# (multiplier, base, allowed length, last n, sequence breakers): what a DRY stage is built from
DryKey = tuple[float, float, int, int, tuple[str, ...]]


class DryStages:
    """DRY stages built once per setting and cloned per request; thread-safe.

    Building one matches every sequence breaker against the whole vocabulary:
    measured on SmolLM2 (49,152 tokens), 8 ms for ``"e"`` but 0.3 s for
    ``"ee"`` and 0.5 s for 40 ``"e"``.  :meth:`prepare` does that on the
    request's worker thread, before the request queues, so the decode thread
    (which every running generation waits on) only clones.  The most recently
    used :data:`CAPACITY` settings are kept, and beyond them every one prepared
    in the last :data:`KEEP_PREPARED_S` seconds: a request's stage must still be
    there when the request starts, or the decode thread would build it (up to
    ≈ 8 s of every stream's time) after a burst of other settings evicted it.
    """

    CAPACITY = 16
    KEEP_PREPARED_S = 300.0
    """A prepared stage outlives :data:`CAPACITY` this long: longer than a request waits in the queue."""
    CLOSE_WAIT_S = 30.0
    """How long :meth:`close` waits for builds in flight: 16 breakers of 40 characters take ≈ 8 s."""

    def __init__(
        self,
        vocab: object,
        build: Callable[[object, DryKey], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._vocab = vocab
        self._build = new_dry_stage if build is None else build
        self._clock = clock
        self._lock = threading.Condition()
        self._built: OrderedDict[DryKey, object] = OrderedDict()
        self._prepared: dict[DryKey, float] = {}  # when each kept stage was last prepared
        self._building = 0  # builds running outside the lock, on the vocabulary
        self._closed = False

    def prepare(self, key: DryKey) -> None:
        """Build the stage for *key* unless it is kept already.

        Raises:
            EngineFailure: the engine is closed (or closed while this was building).

        """
        with self._lock:
            self._check_open()
            if key in self._built:
                self._built.move_to_end(key)
                self._prepared[key] = self._clock()
                return
        self._build_counted(key, keep=True)

    def clone(self, key: DryKey) -> object:
        """A fresh stage for *key* (built now if it is not kept).

        Raises:
            EngineFailure: the engine is closed.

        """
        self.prepare(key)
        with self._lock:  # under the lock: another thread may evict (free) the one cloned
            self._check_open()
            prototype = self._built.get(key)
            if prototype is not None:
                return llama_cpp.llama_sampler_clone(prototype)
        # evicted between the two steps by a burst of other settings
        return self._build_counted(key, keep=False)

    def _build_counted(self, key: DryKey, *, keep: bool) -> object:
        """A new stage for *key*, built outside the lock (the costly part) while :meth:`close` waits."""
        with self._lock:
            self._check_open()
            self._building += 1
        stage = None
        try:
            stage = self._build(self._vocab, key)
        finally:
            with self._lock:
                self._building -= 1
                self._lock.notify_all()
                if stage is not None and (self._closed or (keep and key in self._built)):
                    llama_cpp.llama_sampler_free(stage)  # the model is still there: close() waits for this
                    stage = None
                    self._check_open()  # closed meanwhile; else another thread built it meanwhile
                elif stage is not None and keep:
                    self._built[key] = stage
                    self._prepared[key] = self._clock()
                    self._evict()
        return stage

    def _evict(self) -> None:
        """Free the least recently used stages past :data:`CAPACITY`, none prepared lately (lock held)."""
        stale_before = self._clock() - self.KEEP_PREPARED_S
        excess = len(self._built) - self.CAPACITY
        for old_key in list(self._built):
            if excess <= 0:
                break
            if self._prepared[old_key] <= stale_before:
                llama_cpp.llama_sampler_free(self._built.pop(old_key))
                del self._prepared[old_key]
                excess -= 1

    def close(self) -> None:
        """Refuse new builds, wait (at most :attr:`CLOSE_WAIT_S`) for those in flight, free every kept stage.

        A build reads the model's vocabulary: the model must outlive it.
        """
        with self._lock:
            self._closed = True
            self._lock.wait_for(lambda: self._building == 0, timeout=self.CLOSE_WAIT_S)
            for stage in self._built.values():
                llama_cpp.llama_sampler_free(stage)
            self._built.clear()
            self._prepared.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineFailure("the engine is closed; its DRY stages cannot be built")


def look_back(last_n: int, n_ctx: int) -> int:
    """A penalty's window in tokens: -1 (any negative) is the context, and none is longer than it.

    llama.cpp allocates the window for each DRY and penalties stage (twice for
    DRY, again for each clone) and never clamps it, so a request's
    ``dry_penalty_last_n`` of 2**31 - 1 would ask for 16 GiB; a window longer
    than the context changes nothing.
    """
    if last_n < 0:
        return n_ctx
    return min(last_n, n_ctx) if n_ctx > 0 else last_n


def dry_key(params: SamplingParams, n_ctx: int) -> DryKey | None:
    """What the DRY stage of *params* is built from, or None when it is neutral (left out)."""
    last_n = look_back(params.dry_penalty_last_n, n_ctx)
    if params.dry_multiplier == 0.0 or params.dry_base < 1.0 or last_n == 0:
        return None
    return (
        params.dry_multiplier,
        params.dry_base,
        params.dry_allowed_length,
        last_n,
        params.dry_sequence_breakers,
    )


def new_dry_stage(vocab: object, key: DryKey) -> object:
    """A DRY stage for *key* over *vocab*, built now (the costly part: see :class:`DryStages`)."""
    multiplier, base, allowed_length, last_n, breakers = key
    encoded = [breaker.encode() for breaker in breakers]
    array = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
    return llama_cpp.llama_sampler_init_dry(
        vocab, multiplier, base, allowed_length, last_n, array, len(encoded)
    )
