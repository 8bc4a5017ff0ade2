r"""Fill-in-the-middle prompts: the text around a gap, and files for context, as FIM tokens.

llama-server's ``/infill`` layout (repo-level FIM, as Qwen2.5-Coder and
StarCoder 2 were trained on), with the model's own FIM tokens::

    [FIM_REP]myproject\\n
    [FIM_SEP]<filename>\\n<text>          one per extra chunk
    [FIM_SEP]filename\\n
    [FIM_PRE]<prefix><prompt>[FIM_SUF]<suffix>[FIM_MID]

A vocabulary without ``FIM_REP`` starts without the repository line; one
without ``FIM_SEP`` separates chunks with a ``--- snippet ---`` line instead.
With ``spm`` (``--spm-infill``) the suffix part comes before the prefix part.
A model that adds BOS gets it first (llama-server puts it after the extra context).

The budget follows llama-server: the prefix keeps its last ``3/4 n_batch``
tokens, the suffix its first ``n_batch/4 - 2 - len(prompt)``, and the extra
context its last ``n_ctx - n_batch - 2 n_predict`` (the chunks nearest the
gap survive).
"""

from __future__ import annotations

import attrs

from bubo.engine import FimTokens
from bubo.tokenizer import Tokenizer

__all__ = ["ExtraChunk", "InfillParts", "chunk_chars", "infill_tokens"]

REPOSITORY = "myproject"
"""The repository name in front of the extra context (llama-server's; clients cannot set it)."""
CURRENT_FILE = "filename"
"""The name the file holding the gap gets (llama-server's)."""
DEFAULT_CHUNK_NAME = "tmp"
"""The file name of an extra chunk that gives none."""
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
"""Between extra chunks, for a vocabulary without a file separator token."""


@attrs.frozen(kw_only=True)
class ExtraChunk:
    """One file of extra context (llama-server's ``input_extra`` item)."""

    text: str
    filename: str = DEFAULT_CHUNK_NAME


@attrs.frozen(kw_only=True)
class InfillParts:
    """What a client sends around the gap."""

    prefix: str
    suffix: str
    prompt: str = ""  # text that continues the prefix, where generation starts
    extra: tuple[ExtraChunk, ...] = ()


def infill_tokens(
    tokenizer: Tokenizer,
    fim: FimTokens,
    parts: InfillParts,
    *,
    n_batch: int,
    n_ctx: int,
    n_predict: int,
    spm: bool = False,
) -> list[int]:
    """The prompt token ids for *parts* (see the module's docstring for the layout and budget).

    *n_predict* is the most tokens the request may generate (0 when unlimited),
    which the extra context leaves room for twice over.
    """

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, parse_special=False)

    prompt = encode(parts.prompt)
    prefix = encode(parts.prefix)
    suffix = encode(parts.suffix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)) :]
    suffix = suffix[: max(0, n_batch // 4 - (2 + len(prompt)))]

    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *encode(REPOSITORY + "\n")]
    for chunk in parts.extra:
        if fim.sep is not None:
            extra += [fim.sep, *encode(chunk.filename + "\n")]
        else:
            extra += encode(CHUNK_SEPARATOR)
        extra += encode(chunk.text)
    if fim.sep is not None:
        extra += [fim.sep, *encode(CURRENT_FILE + "\n")]
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))

    before = [fim.pre, *prefix, *prompt]
    after = [fim.suf, *suffix]
    first, second = (after, before) if spm else (before, after)
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return [*bos, *extra[len(extra) - n_extra :], *first, *second, fim.mid]


def chunk_chars(parts: InfillParts) -> int:
    """The characters *parts* hold (the work estimate of tokenizing them)."""
    return (
        len(parts.prefix)
        + len(parts.suffix)
        + len(parts.prompt)
        + sum(len(c.text) + len(c.filename) for c in parts.extra)
    )
