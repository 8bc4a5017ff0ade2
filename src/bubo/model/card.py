"""What a GGUF file says about itself, read once at start-up: its identity and a summary of its metadata.

The identity is the file's size, its modification time and a *fingerprint*: the
SHA-256 of its size and of its first and last :data:`FINGERPRINT_SPAN` bytes.
Hashing a whole multi-gigabyte file would take seconds to minutes; these few
mebibytes take milliseconds and differ between any two real model files (the
head holds the metadata, the tail the last tensors).  It is not the file's
SHA-256, and says so where it is shown.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from .gguf import GGUFMetadata, read_metadata

__all__ = ["FILE_TYPES", "FINGERPRINT_SPAN", "ModelCard", "fingerprint", "read_model_card"]

FINGERPRINT_SPAN = 1024 * 1024
"""Bytes read from each end of the file for its fingerprint."""

SHORT_ARRAY = 5
"""Metadata arrays longer than this (vocabularies, merges) are summarized as empty, as Ollama shows them."""

FILE_TYPES: Mapping[int, str] = MappingProxyType(
    {
        0: "F32",
        1: "F16",
        2: "Q4_0",
        3: "Q4_1",
        7: "Q8_0",
        8: "Q5_0",
        9: "Q5_1",
        10: "Q2_K",
        11: "Q3_K_S",
        12: "Q3_K_M",
        13: "Q3_K_L",
        14: "Q4_K_S",
        15: "Q4_K_M",
        16: "Q5_K_S",
        17: "Q5_K_M",
        18: "Q6_K",
        19: "IQ2_XXS",
        20: "IQ2_XS",
        21: "Q2_K_S",
        22: "IQ3_XS",
        23: "IQ3_XXS",
        24: "IQ1_S",
        25: "IQ4_NL",
        26: "IQ3_S",
        27: "IQ3_M",
        28: "IQ2_S",
        29: "IQ2_M",
        30: "IQ4_XS",
        31: "IQ1_M",
        32: "BF16",
        36: "TQ1_0",
        37: "TQ2_0",
        38: "MXFP4_MOE",
    }
)
"""``general.file_type`` (llama.cpp's ``llama_ftype``) by name."""

_NOT_SUMMARIZED = frozenset({"tokenizer.chat_template", "general.name"})  # shown elsewhere, or misleading


@attrs.frozen(kw_only=True)
class ModelCard:
    """One GGUF file's identity and what its metadata says, as model listings show it."""

    path: Path
    size_bytes: int
    modified: float  # the file's modification time, Unix seconds
    digest: str  # 64 hex digits: the fingerprint (module docstring), not the file's SHA-256
    architecture: str  # general.architecture ("llama", "qwen2", …)
    parameter_count: int  # elements of every tensor
    file_type: str  # "Q4_K_M", …; "unknown" when the file does not say
    context_length: int  # the context the model was trained for; 0 when unknown
    embedding_length: int
    license: str
    metadata: Mapping[str, Any] = attrs.field(repr=False)  # scalars and short arrays; long arrays empty


def fingerprint(path: Path, size: int) -> str:
    """The file's fingerprint: SHA-256 of its size, its first and its last :data:`FINGERPRINT_SPAN` bytes."""
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    with path.open("rb") as file:
        digest.update(file.read(FINGERPRINT_SPAN))
        if size > FINGERPRINT_SPAN:
            file.seek(max(FINGERPRINT_SPAN, size - FINGERPRINT_SPAN))
            digest.update(file.read(FINGERPRINT_SPAN))
    return digest.hexdigest()


def read_model_card(path: Path, metadata: GGUFMetadata | None = None) -> ModelCard:
    """The card of the GGUF at *path* (its metadata read unless given); blocking, milliseconds.

    Raises:
        bubo.model.GGUFError: the file is not a readable GGUF.
        OSError: the file cannot be read.

    """
    metadata = read_metadata(path) if metadata is None else metadata
    stat = path.stat()
    file_type = metadata.get("general.file_type")
    license_ = metadata.get("general.license", "")
    return ModelCard(
        path=path,
        size_bytes=stat.st_size,
        modified=stat.st_mtime,
        digest=fingerprint(path, stat.st_size),
        architecture=metadata.architecture,
        parameter_count=metadata.parameter_count,
        file_type=FILE_TYPES.get(file_type, "unknown") if isinstance(file_type, int) else "unknown",
        context_length=_int(metadata.arch_value("context_length")),
        embedding_length=_int(metadata.arch_value("embedding_length")),
        license=license_ if isinstance(license_, str) else "\n".join(map(str, license_)),
        metadata=MappingProxyType(
            {
                key: [] if isinstance(value, tuple) and len(value) > SHORT_ARRAY else _plain(value)
                for key, value in metadata.items()
                if key not in _NOT_SUMMARIZED
            }
        ),
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _plain(value: Any) -> Any:
    """Tuples as lists, for JSON."""
    return [_plain(item) for item in value] if isinstance(value, tuple) else value
