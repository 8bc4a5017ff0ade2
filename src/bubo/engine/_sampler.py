"""A llama.cpp sampler chain built from :class:`SamplingParams`.

The chain follows llama.cpp's ``common_sampler_init``: a request's ``grammar``
first, then ``logit_bias``, then the stages ``samplers`` names in its order
(by default ``penalties``, ``dry``, ``top_n_sigma``, ``top_k``, ``typ_p``,
``top_p``, ``min_p``, ``xtc``, ``temperature``), and a seeded ``dist``.
``mirostat`` 1 or 2 replaces the stages and ``dist`` with ``temp`` and the
Mirostat sampler.  Greedy settings (``temperature <= 0``, no dynamic range)
end the chain with ``greedy`` instead, keeping only the stages that can change
which token is the most likely (penalties, DRY, typical-p, XTC).  Neutral
stages (penalties of 1.0/0.0, ``top_k`` 0, ``top_p`` 1.0, …) are left out: each
costs time per token and changes nothing.

Only the engine thread that owns the context calls into a sampler.
"""

from __future__ import annotations

import ctypes
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import llama_cpp
import numpy as np
import numpy.typing as npt

from bubo.domain.sampling import SamplingParams

from .errors import EngineFailure

__all__ = ["DryStages", "Sampler", "top_candidates"]

_MIROSTAT_M = 100  # candidates Mirostat 1.0 estimates its s_hat from (llama.cpp's value)
# stages that only ever drop tokens less likely than the most likely one: no effect on a greedy choice
_KEEP_THE_MOST_LIKELY = frozenset({"top_n_sigma", "top_k", "top_p", "min_p", "temperature"})


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
        self._build = _dry if build is None else build
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


def _dry(vocab: object, key: DryKey) -> object:
    multiplier, base, allowed_length, last_n, breakers = key
    encoded = [breaker.encode() for breaker in breakers]
    array = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
    return llama_cpp.llama_sampler_init_dry(
        vocab, multiplier, base, allowed_length, last_n, array, len(encoded)
    )


class Sampler:
    """Owns one llama.cpp sampler chain; call :meth:`close` when done."""

    def __init__(
        self,
        params: SamplingParams,
        *,
        n_vocab: int,
        n_ctx: int = 0,
        vocab: object = None,
        grammar: str | None = None,
        dry: DryStages | None = None,
    ) -> None:
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._params = params
        self._n_vocab = n_vocab
        self._vocab = vocab
        self._dry_stages = dry
        self._n_ctx = n_ctx
        self._penalties: object | None = None  # the first stage of each kind, shown the prompt
        self._dry: object | None = None
        self._grammar = None
        # -1 means the whole context, as in llama-server; llama.cpp itself reads any negative as 0 (off)
        self.repeat_last_n = look_back(params.repeat_last_n, n_ctx)
        self.dry_last_n = look_back(params.dry_penalty_last_n, n_ctx)
        self._seed = secrets.randbits(32) if params.seed is None else params.seed & 0xFFFFFFFF
        add = self._add
        if grammar is not None:
            constraint = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not constraint:
                self.close()
                raise EngineFailure("llama.cpp could not parse the grammar for this request")
            self._grammar = constraint
            add(constraint)
        if params.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))()
            for slot, (token, bias) in zip(biases, params.logit_bias, strict=True):
                slot.token = token
                slot.bias = bias
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
        if params.mirostat != 0:
            self._add_mirostat()
        else:
            self._add_stages()

    def _add_mirostat(self) -> None:
        """``temp`` and Mirostat (1.0 or 2.0), in place of the stages and the draw."""
        params = self._params
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        if params.mirostat == 1:
            stage = llama_cpp.llama_sampler_init_mirostat(
                self._n_vocab, self._seed, params.mirostat_tau, params.mirostat_eta, _MIROSTAT_M
            )
        else:
            stage = llama_cpp.llama_sampler_init_mirostat_v2(
                self._seed, params.mirostat_tau, params.mirostat_eta
            )
        self._add(stage)

    def _add_stages(self) -> None:
        """The stages ``samplers`` names, in its order, then the draw (or the greedy choice)."""
        params = self._params
        stages: dict[str, Callable[[], object | None]] = {
            "penalties": self._penalties_stage,
            "dry": self._dry_stage,
            "top_n_sigma": self._top_n_sigma_stage,
            "top_k": self._top_k_stage,
            "typ_p": self._typical_stage,
            "top_p": self._top_p_stage,
            "min_p": self._min_p_stage,
            "xtc": self._xtc_stage,
            "temperature": self._temperature_stage,
        }
        for name in params.samplers:
            if params.greedy and name in _KEEP_THE_MOST_LIKELY:
                continue
            stage = stages[name]()
            if stage is not None:
                self._add(stage)
        if params.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
        else:
            self._add(llama_cpp.llama_sampler_init_dist(self._seed))

    # ---- the stages: each None when neutral ----------------------------------------------------

    def _penalties_stage(self) -> object | None:
        params = self._params
        if self.repeat_last_n == 0 or (
            params.repeat_penalty == 1.0
            and params.frequency_penalty == 0.0
            and params.presence_penalty == 0.0
        ):
            return None
        stage: object = llama_cpp.llama_sampler_init_penalties(
            self._n_vocab,
            self.repeat_last_n,
            params.repeat_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        )
        self._penalties = self._penalties or stage  # the first one is shown the prompt
        return stage

    def _dry_stage(self) -> object | None:
        key = dry_key(self._params, self._n_ctx)
        if key is None:
            return None
        stage = _dry(self._vocab, key) if self._dry_stages is None else self._dry_stages.clone(key)
        self._dry = self._dry or stage  # the first one is shown the prompt
        return stage

    def _top_n_sigma_stage(self) -> object | None:
        n = self._params.top_n_sigma
        return llama_cpp.llama_sampler_init_top_n_sigma(n) if n > 0.0 else None

    def _top_k_stage(self) -> object | None:
        k = self._params.top_k
        return llama_cpp.llama_sampler_init_top_k(k) if k > 0 else None

    def _typical_stage(self) -> object | None:
        p = self._params.typical_p
        return llama_cpp.llama_sampler_init_typical(p, 1) if p < 1.0 else None

    def _top_p_stage(self) -> object | None:
        p = self._params.top_p
        return llama_cpp.llama_sampler_init_top_p(p, 1) if p < 1.0 else None

    def _min_p_stage(self) -> object | None:
        p = self._params.min_p
        return llama_cpp.llama_sampler_init_min_p(p, 1) if p > 0.0 else None

    def _xtc_stage(self) -> object | None:
        params = self._params
        if params.xtc_probability <= 0.0 or params.xtc_threshold > 0.5:
            return None
        stage: object = llama_cpp.llama_sampler_init_xtc(
            params.xtc_probability, params.xtc_threshold, 1, self._seed
        )
        return stage

    def _temperature_stage(self) -> object:
        params = self._params
        return llama_cpp.llama_sampler_init_temp_ext(
            params.temperature, params.dynatemp_range, params.dynatemp_exponent
        )

    def _add(self, sampler: object) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def remember(self, tokens: Sequence[int]) -> None:
        """Show the penalties and DRY stages (only) the tokens that came before generation began."""
        for stage, last_n in ((self._penalties, self.repeat_last_n), (self._dry, self.dry_last_n)):
            if stage is None or not tokens:
                continue
            for token in tokens[-last_n:]:
                llama_cpp.llama_sampler_accept(stage, token)

    def allows(self, token: int) -> bool:
        """Whether the grammar (if any) admits *token* next; accepting one it rejects aborts llama.cpp."""
        if self._grammar is None:
            return True
        candidate = llama_cpp.llama_token_data(id=token, logit=0.0, p=0.0)
        array = llama_cpp.llama_token_data_array(
            data=ctypes.pointer(candidate), size=1, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return math.isfinite(candidate.logit)

    def accept(self, token: int) -> None:
        """Record a token the engine inserted itself (so penalties and the grammar see it)."""
        llama_cpp.llama_sampler_accept(self._chain, token)

    def sample(self, ctx: object, index: int = -1) -> int:
        """Sample (and accept) a token from the logits at batch position *index* (-1: the last)."""
        token: int = llama_cpp.llama_sampler_sample(self._chain, ctx, index)
        return token

    def close(self) -> None:
        """Free the chain and every sampler in it."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

    # ---- post-sampling probabilities (llama-server's post_sampling_probs) ----------------------

    def sample_candidates(
        self, ctx: object, index: int, n_vocab: int, n_top: int
    ) -> tuple[int, float, list[tuple[int, float]]]:
        """Sample (and accept) as :meth:`sample` does; also return the token's probability and the top.

        The probabilities are those after every stage of the chain (the grammar,
        bias, penalties, top-k/p, min-p, temperature): the distribution the token
        was drawn from.  The top is the *n_top* most probable ``(token, probability)``
        with a probability above 0, most probable first.  A greedy chain leaves only its pick, at 1.
        """
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
        data = (llama_cpp.llama_token_data * n_vocab)()
        view = np.ctypeslib.as_array(data)  # fields id, logit, p
        view["id"] = np.arange(n_vocab, dtype=np.int32)
        view["logit"] = logits
        array = llama_cpp.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise EngineFailure("the sampler chain selected no token")
        token = int(array.data[array.selected].id)  # a stage may have moved the data to a buffer of its own
        llama_cpp.llama_sampler_accept(self._chain, token)
        kept = np.ctypeslib.as_array(array.data, shape=(array.size,))
        probabilities = kept["p"].astype(np.float64)
        if not np.isclose(probabilities.sum(), 1.0, atol=1e-3):  # a greedy chain computes none
            return token, 1.0, [(token, 1.0)]
        return token, float(probabilities[array.selected]), top_candidates(kept["id"], probabilities, n_top)


def top_candidates(
    ids: npt.NDArray[np.int32], probabilities: npt.NDArray[np.float64], n_top: int
) -> list[tuple[int, float]]:
    """The *n_top* most probable ``(id, probability)`` above 0, most probable first, ties in array order.

    What a stable sort of the whole array would give, in O(n) numpy work: on the decode thread
    every stream shares, sorting a whole vocabulary left by ``top_k: 0`` took 62 ms a token.
    """
    n = min(n_top, len(probabilities))
    if n <= 0:
        return []
    threshold = np.partition(probabilities, len(probabilities) - n)[len(probabilities) - n]
    above = np.flatnonzero(probabilities > threshold)
    ties = np.flatnonzero(probabilities == threshold)[: n - len(above)]
    chosen = np.sort(np.concatenate([above, ties]))
    order = chosen[np.argsort(-probabilities[chosen], kind="stable")]
    return [(int(ids[i]), float(probabilities[i])) for i in order if probabilities[i] > 0]
