"""A Hugging Face ``tokenizers.Tokenizer`` built from a GGUF's own metadata.

No network and no ``tokenizer.json``: the vocabulary, merges (or scores) and
token types in the GGUF are enough to rebuild the tokenizer llama.cpp runs,
id for id (``tests/tokenizer/test_parity.py`` checks it against llama.cpp).

- BPE (``tokenizer.ggml.model = gpt2``): llama.cpp's pre-tokenizer regexes for
  the file's ``tokenizer.ggml.pre``, GPT-2 byte-level encoding, the file's merges.
- SentencePiece (``llama``): BPE over ``▁``-escaped text with byte fallback and
  merges ranked by the merged token's score, which is what llama.cpp's SPM
  tokenizer does (highest-scoring adjacent pair first).

Special tokens: CONTROL and UNKNOWN tokens are split out of the text only when
special-token parsing is on; USER_DEFINED tokens always are (llama.cpp's
``tokenizer_st_partition``).

Long texts are cut into pieces tokenized in parallel (``encode_batch_fast``,
on tokenizers' own thread pool).  A cut is made only where every supported BPE
pre-tokenizer ends a pre-token anyway (before a space between a letter, digit
or punctuation mark and a letter; after a new line before a letter; between a
letter and a common punctuation mark), and BPE never merges across pre-tokens,
so the ids are those of the whole text.  50,000 characters: 11.4 ms in one
piece, 4.7 ms in four on the 2-core reference machine.

Pieces are also what bounds the memory of a huge text: the library keeps
about 250 bytes per token of each encoding it returns (token strings, offsets,
masks), so a 10 MB text tokenized at once took 580 MB.  Pieces are tokenized
a batch at a time and only their ids kept; :meth:`HFTokenizer.count` keeps
not even those, and ``limit`` stops once a text is known to have more tokens.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizerCore

from ._pretokenizers import bpe_pretokenizer
from ._vocab import GGUFVocab, TokenType, UnsupportedVocab

__all__ = ["HFTokenizer", "build_hf_tokenizer"]

_SPACE = "\u2581"  # ▁, SentencePiece's escaped space
_SPLIT_OUT_SPECIAL = frozenset({TokenType.CONTROL, TokenType.UNKNOWN})
# Where the BPE pre-tokenizers Bubo supports always start a new pre-token (GPT-2, Llama 3 and
# Qwen2 regexes alike): before " word" after a letter, digit or punctuation mark; after a new
# line that follows no other white space, before a letter (white space at the end of a piece
# would group differently); between a letter and a punctuation mark (never an apostrophe).
_PRE_TOKEN_BOUNDARY = re.compile(
    r"(?<=[A-Za-z0-9.,;:!?])(?= [A-Za-z])"
    r"|(?<=\S\n)(?=[^\W\d_])"
    r"|(?<=[^\W\d_])(?=[.,;:!?\u3001\u3002\uff0c\uff01\uff1f\uff1b\uff1a])"
)
# Texts shorter than this are tokenized in one piece; longer ones in pieces at least this long.
_PARALLEL_PIECE_CHARS = 8192
# Pieces are at most about this long (unless the text has no boundary), tokenized a batch at a time.
_MAX_PIECE_CHARS = 65536
_BATCH_PIECES = 8
_N_BYTES = 256


def build_hf_tokenizer(metadata: Mapping[str, Any]) -> HFTokenizer:
    """Build the tokenizer for a GGUF from its metadata.

    Raises:
        UnsupportedVocab: the file's tokenizer cannot be reproduced exactly
            (the caller falls back to llama.cpp's tokenizer).

    """
    vocab = GGUFVocab.from_metadata(metadata)
    core = _build_bpe(vocab) if vocab.model == "gpt2" else _build_spm(vocab)
    _add_special_tokens(core, vocab)
    return HFTokenizer(core, vocab)


def _build_bpe(vocab: GGUFVocab) -> HFTokenizerCore:
    pre = bpe_pretokenizer(vocab.pre)
    if pre is None:
        raise UnsupportedVocab(f"pre-tokenizer {vocab.pre!r} is not reproducible with tokenizers")
    if not vocab.merges:
        raise UnsupportedVocab("the BPE vocabulary has no merges")
    ranks: dict[tuple[str, str], None] = {}
    for merge in vocab.merges:
        cut = merge.find(" ", 1)  # llama.cpp: the first space after the first character
        if cut > 0:
            ranks.setdefault((merge[:cut], merge[cut + 1 :]), None)  # the first rank wins
    core = HFTokenizerCore(
        models.BPE(
            vocab=_token_ids(vocab),
            merges=list(ranks),
            ignore_merges=pre.ignore_merges,
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]
    )
    return core


def _build_spm(vocab: GGUFVocab) -> HFTokenizerCore:
    if len(vocab.scores) != len(vocab.tokens):
        raise UnsupportedVocab("the SentencePiece vocabulary has no scores")
    if len(set(vocab.scores)) < len(vocab.scores) // 2:
        # converted with placeholder scores: llama.cpp then merges leftmost-first,
        # which ranked BPE merges cannot express
        raise UnsupportedVocab("the SentencePiece scores are placeholders")
    ids = _token_ids(vocab)
    core = HFTokenizerCore(
        models.BPE(
            vocab=ids,
            merges=_merges_from_scores(vocab, ids),
            unk_token=vocab.text_of(vocab.unk_id) or None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps: list[normalizers.Normalizer] = []
    if vocab.add_space_prefix:
        steps.append(normalizers.Prepend(_SPACE))
    steps.append(normalizers.Replace(" ", _SPACE))
    core.normalizer = normalizers.Sequence(steps)
    return core


def _token_ids(vocab: GGUFVocab) -> dict[str, int]:
    ids: dict[str, int] = {}
    for index, text in enumerate(vocab.tokens):
        ids.setdefault(text, index)
    return ids


def _merges_from_scores(vocab: GGUFVocab, ids: Mapping[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a token, best-scoring result first."""
    scores = vocab.scores
    candidates: list[tuple[float, int, str, str]] = []
    for index, text in enumerate(vocab.tokens):
        if vocab.types[index] is not TokenType.NORMAL or len(text) < 2:
            continue
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ids and right in ids:
                candidates.append((-scores[index], cut, left, right))
    candidates.sort(key=lambda c: (c[0], c[1]))
    return [(left, right) for _, _, left, right in candidates]


def _add_special_tokens(core: HFTokenizerCore, vocab: GGUFVocab) -> None:
    special = []
    user_defined = []
    for index, text in enumerate(vocab.tokens):
        kind = vocab.types[index]
        if kind in _SPLIT_OUT_SPECIAL:
            special.append(AddedToken(text, special=True, normalized=False))
        elif kind is TokenType.USER_DEFINED:
            user_defined.append(AddedToken(text, special=False, normalized=False))
    core.add_special_tokens(special)
    core.add_tokens(user_defined)


class HFTokenizer:
    """llama.cpp-exact tokenization on Hugging Face ``tokenizers`` (thread-safe)."""

    name = "huggingface-tokenizers"

    def __init__(self, core: HFTokenizerCore, vocab: GGUFVocab) -> None:
        self._core = core
        self._vocab = vocab
        self._bos_id = vocab.bos_id
        self._eos_id = vocab.eos_id
        # cutting at pre-token boundaries is exact for byte-level BPE, unless a token the
        # text is searched for first could span a cut
        self._cuttable = vocab.model == "gpt2" and not any(
            _spans_a_boundary(token.content) for token in core.get_added_tokens_decoder().values()
        )

    @property
    def n_vocab(self) -> int:
        """Number of token ids."""
        return len(self._vocab.tokens)

    @property
    def bos_token(self) -> str:
        """The BOS token's text."""
        return self._vocab.text_of(self._bos_id)

    @property
    def eos_token(self) -> str:
        """The EOS token's text."""
        return self._vocab.text_of(self._eos_id)

    @property
    def bos_id(self) -> int | None:
        """The BOS token's id (None when the model has none)."""
        return self._bos_id

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(add_special=True)`` starts with BOS."""
        return self._vocab.add_bos and self._bos_id is not None

    @functools.cached_property
    def _core_without_special(self) -> HFTokenizerCore:
        """A twin that treats CONTROL markup as plain text (``parse_special=False``)."""
        twin = HFTokenizerCore.from_str(self._core.to_str())
        twin.encode_special_tokens = True
        return twin

    @functools.cached_property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token can stand for; None when a token can stand for any text.

        Byte-level BPE and SentencePiece with byte fallback never produce an
        unknown token, so every token covers exactly its own piece's bytes.
        """
        if self._vocab.model != "gpt2" and sum(t is TokenType.BYTE for t in self._vocab.types) < _N_BYTES:
            return None
        return max(len(piece) for piece in self._pieces)

    def encode(
        self, text: str, *, add_special: bool = False, parse_special: bool = True, limit: int | None = None
    ) -> list[int]:
        """Token ids of *text*, exactly as ``llama_tokenize`` gives them.

        With *limit*, tokenizing may stop once more than *limit* ids are found:
        the result is then a prefix of the ids, longer than *limit*.
        """
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self._bos_id)  # type: ignore[arg-type]
        for batch in self._encoded_batches(text, parse_special=parse_special):
            ids.extend(batch)
            if limit is not None and len(ids) > limit:
                return ids
        if add_special and self._vocab.add_eos and self._eos_id is not None:
            ids.append(self._eos_id)
        return ids

    def count(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> int:
        """``len(encode(...))`` without keeping the ids."""
        n = sum(len(batch) for batch in self._encoded_batches(text, parse_special=parse_special))
        if add_special:
            n += int(self.add_bos) + int(self._vocab.add_eos and self._eos_id is not None)
        return n

    def _encoded_batches(self, text: str, *, parse_special: bool) -> Iterator[list[int]]:
        """The ids of *text*, a batch of pieces at a time (each batch's encodings freed before the next)."""
        if not text:
            return
        core = self._core if parse_special else self._core_without_special
        batch: list[str] = []
        for piece in self._pieces_of(text):
            batch.append(piece)
            if len(batch) == _BATCH_PIECES:
                yield _ids(core, batch)
                batch = []
        if batch:
            yield _ids(core, batch)

    def _pieces_of(self, text: str) -> Iterator[str]:
        """*text* cut at pre-token boundaries into pieces that can be tokenized in parallel."""
        size = min(max(len(text) // _BATCH_PIECES, _PARALLEL_PIECE_CHARS), _MAX_PIECE_CHARS)
        if len(text) < 2 * _PARALLEL_PIECE_CHARS or not self._cuttable:
            yield text
            return
        start = 0
        while len(text) - start > size:
            boundary = _PRE_TOKEN_BOUNDARY.search(text, start + size)
            if boundary is None:
                break
            yield text[start : boundary.start()]
            start = boundary.start()
        yield text[start:]

    @functools.cached_property
    def _pieces(self) -> tuple[bytes, ...]:
        return tuple(_piece(self._vocab, token) for token in range(self.n_vocab))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes *token_id* renders to (``llama_token_to_piece(special=True)``)."""
        return self._pieces[token_id]

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of *token_ids*, special tokens included."""
        pieces = self._pieces
        return b"".join(pieces[t] for t in token_ids).decode("utf-8", errors="replace")


def _ids(core: HFTokenizerCore, pieces: list[str]) -> list[int]:
    return [i for encoding in core.encode_batch_fast(pieces, add_special_tokens=False) for i in encoding.ids]


def _spans_a_boundary(text: str) -> bool:
    """Whether a cut could fall inside *text* (an added token, matched before pre-tokenizing).

    A letter is appended: a cut before a space looks at the letter after it.
    """
    return any(0 < m.start() < len(text) for m in _PRE_TOKEN_BOUNDARY.finditer(text + "a"))


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    stand_ins = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            stand_ins.append(0x100 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, stand_ins, strict=True)}


def _piece(vocab: GGUFVocab, token: int) -> bytes:
    kind = vocab.types[token]
    text = vocab.tokens[token]
    if kind in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
        return text.encode()
    if kind is TokenType.BYTE:
        return _byte_token(vocab, text)
    if kind is not TokenType.NORMAL:
        return b""
    if vocab.model == "llama":
        return text.replace(_SPACE, " ").encode()
    decoder = _byte_decoder()
    try:
        return bytes(decoder[char] for char in text)
    except KeyError:  # not byte-level text; llama.cpp prints a marker, we keep the text
        return text.encode()


def _byte_token(vocab: GGUFVocab, text: str) -> bytes:
    if vocab.model == "llama" and text.startswith("<0x") and text.endswith(">"):
        return bytes([int(text[3:-1], 16)])
    decoder = _byte_decoder()
    return bytes(decoder[c] for c in text) if all(c in decoder for c in text) else text.encode()
