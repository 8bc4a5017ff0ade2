"""A llama.cpp sampler chain built from :class:`SamplingParams`.

The order follows llama-server's default (a request's ``grammar`` first, then
``logit_bias``, ``penalties``, ``top_k``, ``top_p``, ``min_p``,
``temperature``, and a seeded ``dist``);
``temperature <= 0`` ends the chain with ``greedy`` instead.  Neutral stages
(penalties of 1.0/0.0, no bias) are left out: each costs time per token.

Only the engine thread that owns the context calls into a sampler.
"""

from __future__ import annotations

import ctypes
import math
import secrets
from collections.abc import Sequence

import llama_cpp
import numpy as np

from bubo.domain.sampling import SamplingParams

from .base import EngineFailure

__all__ = ["Sampler"]


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
    ) -> None:
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._penalties = None
        self._grammar = None
        wants_penalties = (
            params.repeat_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        ) and params.repeat_last_n != 0
        # -1 means the whole context, as in llama-server; llama.cpp itself reads any negative as 0 (off)
        self.repeat_last_n = n_ctx if params.repeat_last_n < 0 else params.repeat_last_n
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
        if wants_penalties:
            self._penalties = llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                self.repeat_last_n,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
            add(self._penalties)
        if params.greedy:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            seed = secrets.randbits(32) if params.seed is None else params.seed & 0xFFFFFFFF
            add(llama_cpp.llama_sampler_init_dist(seed))

    def _add(self, sampler: object) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def remember(self, tokens: Sequence[int]) -> None:
        """Show the penalties stage (only) the tokens that came before generation began."""
        if self._penalties is None or not tokens:
            return
        window = tokens[-self.repeat_last_n :]
        for token in window:
            llama_cpp.llama_sampler_accept(self._penalties, token)

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

    def sample_candidates(self, ctx: object, index: int, n_vocab: int) -> tuple[int, list[tuple[int, float]]]:
        """Sample (and accept) as :meth:`sample` does; also return what the chain left, most probable first.

        The candidates are ``(token, probability)`` after every stage of the chain
        (the grammar, bias, penalties, top-k/p, min-p, temperature): the
        distribution the token was drawn from.  A greedy chain leaves only its pick, at 1.
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
            return token, [(token, 1.0)]
        order = np.argsort(-probabilities, kind="stable")
        return token, [(int(kept["id"][i]), float(probabilities[i])) for i in order if probabilities[i] > 0]
