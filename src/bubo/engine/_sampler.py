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

:class:`SamplerStages` makes the stages, :class:`Sampler` drives the chain they
are in; DRY stages are built ahead of the decode thread (:mod:`._dry_stages`).
Only the engine thread that owns the context calls into a sampler.
"""

from __future__ import annotations

import ctypes
import math
import secrets
from collections.abc import Callable, Sequence

import llama_cpp
import numpy as np
import numpy.typing as npt

from bubo.domain.sampling import SamplingParams

from ._dry_stages import DryStages, dry_key, look_back, new_dry_stage
from .errors import EngineFailure

__all__ = ["Sampler", "SamplerStages", "top_candidates"]

_MIROSTAT_M = 100  # candidates Mirostat 1.0 estimates its s_hat from (llama.cpp's value)
# stages that only ever drop tokens less likely than the most likely one: no effect on a greedy choice
_KEEP_THE_MOST_LIKELY = frozenset({"top_n_sigma", "top_k", "top_p", "min_p", "temperature"})


class SamplerStages:
    """The llama.cpp samplers one request's settings make, added to its chain in llama.cpp's order.

    What changes when a setting or a stage is added (see the module's docstring for the order and
    what is left out); :class:`Sampler` drives the chain.  The stages that remember tokens
    (penalties, DRY) and the grammar are kept here, owned by the chain, for :class:`Sampler` to
    show the prompt to and to ask.
    """

    def __init__(
        self, params: SamplingParams, *, n_vocab: int, n_ctx: int, vocab: object, dry: DryStages | None
    ) -> None:
        self._params = params
        self._n_vocab = n_vocab
        self._n_ctx = n_ctx
        self._vocab = vocab
        self._dry_stages = dry
        self._seed = secrets.randbits(32) if params.seed is None else params.seed & 0xFFFFFFFF
        self._chain: object = None
        self.penalties: object | None = None  # the first stage of each kind, shown the prompt
        self.dry: object | None = None
        self.grammar: object | None = None
        # -1 means the whole context, as in llama-server; llama.cpp itself reads any negative as 0 (off)
        self.repeat_last_n = look_back(params.repeat_last_n, n_ctx)
        self.dry_last_n = look_back(params.dry_penalty_last_n, n_ctx)

    def add_to(self, chain: object, grammar: str | None) -> None:
        """Add every stage to *chain*: the *grammar* (GBNF), the logit bias, the stages or Mirostat.

        Raises:
            EngineFailure: llama.cpp could not parse the grammar, or the engine is closed.

        """
        self._chain = chain
        params = self._params
        if grammar is not None:
            constraint = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
            if not constraint:
                raise EngineFailure("llama.cpp could not parse the grammar for this request")
            self.grammar = constraint
            self._add(constraint)
        if params.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))()
            for slot, (token, bias) in zip(biases, params.logit_bias, strict=True):
                slot.token = token
                slot.bias = bias
            self._add(llama_cpp.llama_sampler_init_logit_bias(self._n_vocab, len(biases), biases))
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

    def _add(self, sampler: object) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

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
        self.penalties = self.penalties or stage  # the first one is shown the prompt
        return stage

    def _dry_stage(self) -> object | None:
        key = dry_key(self._params, self._n_ctx)
        if key is None:
            return None
        stage = new_dry_stage(self._vocab, key) if self._dry_stages is None else self._dry_stages.clone(key)
        self.dry = self.dry or stage  # the first one is shown the prompt
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


class Sampler:
    """Owns one llama.cpp sampler chain (its stages: :class:`SamplerStages`); call :meth:`close` when done."""

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
        """Build the chain *params* and *grammar* make.

        Raises:
            EngineFailure: llama.cpp could not parse the grammar, or the engine is closed (the chain,
                and what was added to it, is freed).

        """
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._stages = SamplerStages(params, n_vocab=n_vocab, n_ctx=n_ctx, vocab=vocab, dry=dry)
        try:
            self._stages.add_to(self._chain, grammar)
        except BaseException:
            self.close()
            raise

    def remember(self, tokens: Sequence[int]) -> None:
        """Show the penalties and DRY stages (only) the tokens that came before generation began."""
        stages = self._stages
        for stage, last_n in ((stages.penalties, stages.repeat_last_n), (stages.dry, stages.dry_last_n)):
            if stage is None or not tokens:
                continue
            for token in tokens[-last_n:]:
                llama_cpp.llama_sampler_accept(stage, token)

    def allows(self, token: int) -> bool:
        """Whether the grammar (if any) admits *token* next; accepting one it rejects aborts llama.cpp."""
        grammar = self._stages.grammar
        if grammar is None:
            return True
        candidate = llama_cpp.llama_token_data(id=token, logit=0.0, p=0.0)
        array = llama_cpp.llama_token_data_array(
            data=ctypes.pointer(candidate), size=1, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(array))
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
