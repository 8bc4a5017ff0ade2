"""What llama.cpp says of a loaded model, as :class:`~.base.ModelInfo` (``/props``, ``/v1/models``).

Read once, from the first load: a wake-up loads the same file under the same
options, so the description holds while the model sleeps and after.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import llama_cpp

from .base import FimTokens, ModelInfo

if TYPE_CHECKING:
    from ._context import LlamaContext
    from ._lasting import Vocabulary
    from .llama import LlamaOptions

__all__ = ["describe", "generates"]


def describe(
    model: object,
    context: LlamaContext,
    options: LlamaOptions,
    *,
    vocabulary: Vocabulary,
    identity: str,
) -> ModelInfo:
    """The model's facts: its metadata, the context's size, the tokens it ends on, its FIM tokens."""
    vocab = context.vocab
    description = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, description, len(description))
    return ModelInfo(
        path=str(options.model_path),
        architecture=_meta(model, "general.architecture"),
        n_ctx=context.n_ctx_seq,
        n_ctx_train=llama_cpp.llama_model_n_ctx_train(model),
        n_vocab=context.n_vocab,
        n_embd=llama_cpp.llama_model_n_embd(model),
        n_params=llama_cpp.llama_model_n_params(model),
        size_bytes=llama_cpp.llama_model_size(model),
        vocab_type=llama_cpp.llama_vocab_type(vocab),
        description=description.value.decode(errors="replace"),
        eog_token_ids=vocabulary.eog,
        repack=options.repack,
        n_batch=context.n_batch,
        fim=_fim_tokens(vocab),
        draft_model=None if options.draft_model_path is None else str(options.draft_model_path),
        context_shift=options.context_shift,
        state_identity=identity,
        generates=generates(model, context.ctx),
    )


def generates(model: object, ctx: object) -> bool:
    """Whether *model* can generate text: a decoder whose context attends causally (not BERT's kind)."""
    return bool(llama_cpp.llama_model_has_decoder(model)) and bool(llama_cpp.llama_get_causal_attn(ctx))


def _meta(model: object, key: str) -> str:
    buffer = ctypes.create_string_buffer(256)
    size = llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode(errors="replace") if size >= 0 else ""


def _fim_tokens(vocab: object) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens, as llama.cpp found them (metadata or token texts)."""

    def token(value: int) -> int | None:
        return None if value < 0 else value  # LLAMA_TOKEN_NULL is -1

    pre = token(llama_cpp.llama_vocab_fim_pre(vocab))
    suf = token(llama_cpp.llama_vocab_fim_suf(vocab))
    mid = token(llama_cpp.llama_vocab_fim_mid(vocab))
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(
        pre=pre,
        suf=suf,
        mid=mid,
        rep=token(llama_cpp.llama_vocab_fim_rep(vocab)),
        sep=token(llama_cpp.llama_vocab_fim_sep(vocab)),
    )
