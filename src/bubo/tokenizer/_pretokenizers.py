"""llama.cpp's pre-tokenizer regex lists, by ``tokenizer.ggml.pre`` name.

Copied in meaning from ``llama-vocab.cpp``: each list is applied in order,
every regex further splitting the pieces the previous one produced, with the
text between matches kept as pieces of its own (``Split(..., "isolated")``).
Only the lists whose semantics the Oniguruma engine inside Hugging Face
``tokenizers`` reproduces exactly are listed; any other name makes Bubo fall
back to llama.cpp's own tokenizer (and say so at start-up).
"""

from __future__ import annotations

import attrs

__all__ = ["BPEPreTokenizer", "bpe_pretokenizer"]

# GPT-2: llama.cpp runs a hand-written splitter for this exact string; the
# trailing \s+ it implements is written out here.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


@attrs.frozen
class BPEPreTokenizer:
    """How one family splits text before BPE."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False


_GPT2_FAMILY = BPEPreTokenizer((_GPT2,))
_DIGITS_THEN_GPT2 = BPEPreTokenizer((r"\p{N}", _GPT2))
_LLAMA3_FAMILY = BPEPreTokenizer((_LLAMA3,), ignore_merges=True)
_LLAMA3_REGEX_ONLY = BPEPreTokenizer((_LLAMA3,))
_QWEN2_FAMILY = BPEPreTokenizer((_QWEN2,))

_BY_NAME: dict[str, BPEPreTokenizer] = {
    **dict.fromkeys(
        ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
         "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais", "trillion"),
        _GPT2_FAMILY,
    ),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        _DIGITS_THEN_GPT2,
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        _LLAMA3_FAMILY,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _LLAMA3_REGEX_ONLY),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"),
        _QWEN2_FAMILY,
    ),
}  # fmt: skip


def bpe_pretokenizer(name: str) -> BPEPreTokenizer | None:
    """The pre-tokenizer for ``tokenizer.ggml.pre`` *name*, or ``None`` if not reproducible."""
    return _BY_NAME.get(name)
