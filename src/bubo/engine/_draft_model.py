"""A draft model (``--model-draft``): a second llama.cpp model, in a context of its own, proposing tokens.

It is loaded beside the main model and checked against it the way llama.cpp's
``common_speculative_are_compatible`` checks: the same vocabulary type, the
same BOS and EOS tokens and whether they are added, vocabularies of nearly the
same size (at most 128 tokens apart) and the same text for every token from id
5 on.  A draft whose token ids mean something else could never be accepted, so
an incompatible one is refused at start, with the first difference found.

Its context has one KV sequence per slot, like the main one; only the decode
thread uses it (:mod:`._model_drafts` keeps each sequence in step with its
slot's tokens).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from ._context import LlamaContext
from .errors import EngineFailure
from .stats import EngineCounters

__all__ = ["MAX_VOCAB_DIFFERENCE", "DraftModel", "IncompatibleDraft", "check_compatible"]

# llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE and SPEC_VOCAB_CHECK_START_TOKEN_ID
MAX_VOCAB_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


class IncompatibleDraft(EngineFailure):
    """The draft model's vocabulary is not the main model's: its drafts could not be verified."""


class DraftModel:
    """The draft model's weights and its context (one sequence per slot)."""

    def __init__(
        self,
        path: Path,
        target: object,
        params: llama_cpp.llama_context_params,
        *,
        n_gpu_layers: int,
        repack: bool,
    ) -> None:
        """Load *path* and check it against the *target* model; *params* size its context.

        *repack*: llama.cpp's CPU weight repacking, as the probe decided for this CPU and build.

        Raises:
            EngineFailure: llama.cpp could not load it or create its context.
            IncompatibleDraft: its vocabulary is not the target's.

        """
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = n_gpu_layers
        model_params.use_extra_bufts = repack
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        if not model:
            raise EngineFailure(f"llama.cpp could not load the draft model {path}")
        try:
            check_compatible(target, model, path.name)
            # a sliding-window model keeps its whole sequence, so a draft sequence can be cut to a prefix
            params.swa_full = llama_cpp.llama_model_n_swa(model) > 0
            self.context = LlamaContext(model, params, totals=EngineCounters(), snapshots=None)
        except BaseException:
            llama_cpp.llama_model_free(model)
            raise
        self.path = path
        self.size_bytes: int = llama_cpp.llama_model_size(model)
        self._model: object | None = model

    def close(self) -> None:
        """Free the context and the weights (after the decode thread stopped)."""
        self.context.close()
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None


def check_compatible(target: object, draft: object, name: str) -> None:
    """Raise unless *draft*'s tokens are *target*'s (llama.cpp's checks, in its order).

    Raises:
        IncompatibleDraft: the first difference, in words.

    """
    vocab_t, vocab_d = llama_cpp.llama_model_get_vocab(target), llama_cpp.llama_model_get_vocab(draft)
    refused = f"the draft model {name} cannot draft for this model"
    type_t, type_d = llama_cpp.llama_vocab_type(vocab_t), llama_cpp.llama_vocab_type(vocab_d)
    if type_t != type_d:
        raise IncompatibleDraft(f"{refused}: its vocabulary type is {type_d}, the model's {type_t}")
    specials = {
        "adds BOS": (llama_cpp.llama_vocab_get_add_bos(vocab_t), llama_cpp.llama_vocab_get_add_bos(vocab_d)),
        "adds EOS": (llama_cpp.llama_vocab_get_add_eos(vocab_t), llama_cpp.llama_vocab_get_add_eos(vocab_d)),
        "BOS token": (llama_cpp.llama_vocab_bos(vocab_t), llama_cpp.llama_vocab_bos(vocab_d)),
        "EOS token": (llama_cpp.llama_vocab_eos(vocab_t), llama_cpp.llama_vocab_eos(vocab_d)),
    }
    for what, (mine, theirs) in specials.items():
        if mine != theirs:
            raise IncompatibleDraft(
                f"{refused}: its special tokens differ ({what}: {theirs}, the model's {mine})"
            )
    n_t, n_d = llama_cpp.llama_vocab_n_tokens(vocab_t), llama_cpp.llama_vocab_n_tokens(vocab_d)
    if abs(n_t - n_d) > MAX_VOCAB_DIFFERENCE:
        raise IncompatibleDraft(
            f"{refused}: its vocabulary has {n_d} tokens, the model's {n_t} "
            f"(at most {MAX_VOCAB_DIFFERENCE} apart)"
        )
    for token in range(FIRST_CHECKED_TOKEN, min(n_t, n_d)):
        mine, theirs = (
            llama_cpp.llama_vocab_get_text(vocab_t, token),
            llama_cpp.llama_vocab_get_text(vocab_d, token),
        )
        if mine != theirs:
            raise IncompatibleDraft(
                f"{refused}: token {token} is {theirs!r} in the draft model, {mine!r} in the model"
            )
