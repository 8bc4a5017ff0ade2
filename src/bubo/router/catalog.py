"""The models of ``--models-dir``, found the way llama-server finds them.

A ``NAME.gguf`` file in the directory is the model ``NAME``; a subdirectory
``NAME/`` holding GGUFs is the model ``NAME`` (multi-file models): its first
shard (``…-00001-of-…``) or else its one other GGUF is the file to load.
Files whose name contains ``mmproj`` are multimodal projectors, listed but
not loaded (Bubo serves text models). A name with a comma is skipped (with a
warning): ``--served-model-name`` reads commas as separators between names.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs

__all__ = ["CatalogEntry", "scan_models_dir"]

GGUF_SUFFIX = ".gguf"
FIRST_SHARD_MARK = "-00001-of-"
PROJECTOR_MARK = "mmproj"
NAME_SEPARATOR = ","

logger = logging.getLogger(__name__)


@attrs.frozen
class CatalogEntry:
    """One model of the directory: its name (the request's ``model``) and the GGUF to load."""

    name: str
    path: Path
    projector: Path | None = None  # a multimodal projector beside it (not loaded)


def scan_models_dir(directory: Path) -> tuple[CatalogEntry, ...]:
    """The models in *directory*, sorted by name; what is not a model is skipped."""
    entries: list[CatalogEntry] = []
    for item in sorted(directory.iterdir()):
        if item.is_dir():
            entry = _scan_subdirectory(item)
        elif _is_gguf(item) and PROJECTOR_MARK not in item.name:
            entry = CatalogEntry(name=item.name.removesuffix(GGUF_SUFFIX), path=item)
        else:
            continue
        if entry is None:
            continue
        if NAME_SEPARATOR in entry.name:
            logger.warning("skipping %s: a model name cannot contain %r", item, NAME_SEPARATOR)
            continue
        entries.append(entry)
    return tuple(entries)


def _scan_subdirectory(folder: Path) -> CatalogEntry | None:
    files = sorted(f for f in folder.iterdir() if _is_gguf(f))
    projectors = [f for f in files if PROJECTOR_MARK in f.name]
    weights = [f for f in files if PROJECTOR_MARK not in f.name]
    first_shards = [f for f in weights if FIRST_SHARD_MARK in f.name]
    chosen = first_shards[0] if first_shards else (weights[0] if weights else None)
    if chosen is None:
        return None
    return CatalogEntry(name=folder.name, path=chosen, projector=projectors[0] if projectors else None)


def _is_gguf(path: Path) -> bool:
    return path.name.endswith(GGUF_SUFFIX) and path.is_file()
