"""llama.cpp's own tokenizer on a vocabulary-only model load.

Two uses: the reference that ``tests/tokenizer/test_parity.py`` compares the
Hugging Face tokenizer against, and the fallback for GGUFs whose pre-tokenizer
Bubo cannot reproduce (``bubo.runtime`` says so at start-up).  Loading with
``vocab_only`` reads no weights, so it is cheap.  llama.cpp's tokenizer
functions are read-only on the vocabulary and safe to call from any thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from .errors import EngineFailure

__all__ = ["LlamaVocabTokenizer"]


class LlamaVocabTokenizer:
    """The :class:`bubo.tokenizer.Tokenizer` interface over ``llama_tokenize``."""

    name = "llama.cpp"

    def __init__(self, model_path: Path) -> None:
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        if not model:
            raise EngineFailure(f"llama.cpp could not read the vocabulary of {model_path}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        self._bos_id = bos if bos >= 0 else None
        self._bos = self.token_bytes(bos).decode(errors="replace") if bos >= 0 else ""
        self._eos = self.token_bytes(eos).decode(errors="replace") if eos >= 0 else ""
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab)) and bos >= 0

    @property
    def n_vocab(self) -> int:
        """Number of token ids."""
        return self._n_vocab

    @property
    def bos_token(self) -> str:
        """The BOS token's text."""
        return self._bos

    @property
    def eos_token(self) -> str:
        """The EOS token's text."""
        return self._eos

    @property
    def bos_id(self) -> int | None:
        """The BOS token's id (None when the model has none)."""
        return self._bos_id

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(add_special=True)`` starts with BOS."""
        return self._add_bos

    @property
    def max_token_bytes(self) -> int | None:
        """None: llama.cpp may emit an unknown token for any run of text, so no bound is claimed."""
        return None

    def count(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> int:
        """The number of ids of *text*."""
        return len(self.encode(text, add_special=add_special, parse_special=parse_special))

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True, limit: int | None = None
    ) -> list[int]:
        """``llama_tokenize`` of *text* (whole: *limit* does not shorten the work here)."""
        del limit
        data = text.encode()
        capacity = len(data) + 8
        out = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), out, capacity, add_special, parse_special
        )
        if count < 0:  # cannot happen with one slot per byte, but llama.h allows it
            capacity = -count
            out = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), out, capacity, add_special, parse_special
            )
        return list(out[:count])

    def token_bytes(self, token_id: int) -> bytes:
        """``llama_token_to_piece(special=True)``."""
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, len(buffer), 0, True)  # noqa: FBT003
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, len(buffer), 0, True)  # noqa: FBT003
        return buffer.raw[:size]

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of *token_ids*, special tokens included."""
        return b"".join(self.token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")

    def close(self) -> None:
        """Free the vocabulary."""
        if self._model is not None:
            llama_cpp.llama_model_free(self._model)
            self._model = None
