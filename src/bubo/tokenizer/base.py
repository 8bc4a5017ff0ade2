"""The tokenizer interface every layer uses: one source of token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["Tokenizer"]


class Tokenizer(Protocol):
    """Text to llama.cpp token ids and back.

    ``encode`` must give exactly the ids llama.cpp's ``llama_tokenize`` gives
    for the same model and flags; ``token_bytes`` is llama.cpp's
    ``llama_token_to_piece(special=True)``.
    """

    @property
    def name(self) -> str:
        """Which implementation this is, for logs and ``/props``."""
        ...

    @property
    def n_vocab(self) -> int:
        """Number of token ids."""
        ...

    @property
    def bos_token(self) -> str:
        """The BOS token's text ("" when the model has none)."""
        ...

    @property
    def eos_token(self) -> str:
        """The EOS token's text ("" when the model has none)."""
        ...

    @property
    def bos_id(self) -> int | None:
        """The BOS token's id (None when the model has none)."""
        ...

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(add_special=True)`` starts with BOS (then ``bos_id`` is not None)."""
        ...

    @property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for (None: no bound, a token may stand for any text).

        ``bytes(text) / max_token_bytes`` is then a lower bound on the token
        count, known without tokenizing.
        """
        ...

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True, limit: int | None = None
    ) -> list[int]:
        """Token ids of *text*; special-token markup is parsed unless told not to.

        With *limit*, tokenizing may stop once more than *limit* ids are found
        (the result is then a prefix of the ids, longer than *limit*).
        """
        ...

    def count(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> int:
        """How many ids ``encode`` gives, with as little memory as the implementation can."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token renders to, special tokens included."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of *token_ids* (invalid UTF-8 replaced), special tokens included."""
        ...
