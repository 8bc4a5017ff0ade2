"""The model id a server answers to.

Derived from the file name, as the reference shows
(``Huihui-Qwen3.8-Flash-Next-UD-Q4_K_XL-v1.gguf`` →
``huihui-qwen38-flash-next-ud-q4-k-xl-v1``): lower case, a dot between two
digits dropped, every other run of non-alphanumerics one hyphen.  The file name
beats ``general.name``, which converters often fill with a training-run label
(SmolLM2's is "Smollm2 135M 8k Lc100K Mix1 Ep2").
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["ALIAS", "model_id_from_path"]

ALIAS = "bubo"
"""The second name every served model answers to."""

_DIGIT_DOT_DIGIT = re.compile(r"(?<=\d)\.(?=\d)")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


def model_id_from_path(path: Path) -> str:
    """The served id for the GGUF at *path*."""
    stem = path.name.removesuffix(".gguf").lower()
    stem = _DIGIT_DOT_DIGIT.sub("", stem)
    return _SEPARATORS.sub("-", stem).strip("-") or ALIAS
