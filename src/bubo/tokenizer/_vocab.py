"""The vocabulary a GGUF file describes, with llama.cpp's load-time fix-ups."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["GGUFVocab", "TokenType", "UnsupportedVocab"]


class UnsupportedVocab(ValueError):
    """Bubo cannot reproduce this GGUF's tokenizer exactly with Hugging Face tokenizers."""


class TokenType(enum.IntEnum):
    """``tokenizer.ggml.token_type`` values."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# llama.cpp (llama-vocab.cpp) forces these texts to CONTROL and end-of-generation.
_FORCED_CONTROL = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>",  # noqa: RUF001 - DeepSeek's literal token
    }
)  # fmt: skip
# llama.cpp turns these CONTROL tokens into USER_DEFINED (harmony format markers).
_FORCED_USER_DEFINED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})


@attrs.frozen(kw_only=True)
class GGUFVocab:
    """Tokens, types, merges/scores and special ids from ``tokenizer.ggml.*``."""

    model: str  # "gpt2" (BPE) or "llama" (SentencePiece)
    pre: str
    tokens: tuple[str, ...]
    types: tuple[TokenType, ...]
    scores: tuple[float, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> GGUFVocab:
        """Read the vocabulary from GGUF metadata.

        Raises:
            UnsupportedVocab: no vocabulary, or a tokenizer model other than
                ``gpt2`` (BPE) and ``llama`` (SentencePiece).

        """
        model = str(metadata.get("tokenizer.ggml.model", ""))
        tokens = tuple(metadata.get("tokenizer.ggml.tokens", ()))
        if not tokens:
            raise UnsupportedVocab("the GGUF has no tokenizer.ggml.tokens")
        if model not in ("gpt2", "llama"):
            raise UnsupportedVocab(f"tokenizer model {model!r} is not supported")
        raw_types = metadata.get("tokenizer.ggml.token_type") or (TokenType.NORMAL,) * len(tokens)
        types = [
            TokenType(t) if t in TokenType._value2member_map_ else TokenType.UNDEFINED for t in raw_types
        ]
        for index, text in enumerate(tokens):
            if text in _FORCED_CONTROL:
                types[index] = TokenType.CONTROL
            elif text in _FORCED_USER_DEFINED and types[index] is TokenType.CONTROL:
                types[index] = TokenType.USER_DEFINED
        is_spm = model == "llama"
        bos = _token_id(metadata, "tokenizer.ggml.bos_token_id", len(tokens), 1 if is_spm else None)
        eos = _token_id(metadata, "tokenizer.ggml.eos_token_id", len(tokens), 2 if is_spm else None)
        unk = _token_id(metadata, "tokenizer.ggml.unknown_token_id", len(tokens), 0 if is_spm else None)
        pre = str(metadata.get("tokenizer.ggml.pre", "default")) if not is_spm else "default"
        default_add_bos = is_spm or pre in _ADD_BOS_PRE
        return cls(
            model=model,
            pre=pre,
            tokens=tokens,
            types=tuple(types),
            scores=tuple(metadata.get("tokenizer.ggml.scores", ())),
            merges=tuple(metadata.get("tokenizer.ggml.merges", ())),
            bos_id=bos,
            eos_id=eos,
            unk_id=unk,
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos)),
            add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
            add_space_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", is_spm)),
        )

    def text_of(self, token_id: int | None) -> str:
        """The raw vocabulary text of *token_id* ("" for ``None``)."""
        return "" if token_id is None else self.tokens[token_id]


# BPE pre-tokenizers for which llama.cpp adds BOS by default
_ADD_BOS_PRE = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
     "tekken", "chameleon"}
)  # fmt: skip


def _token_id(metadata: Mapping[str, Any], key: str, n_vocab: int, default: int | None) -> int | None:
    value = metadata.get(key, default)
    if value is None or not 0 <= int(value) < n_vocab:
        return None
    return int(value)
