"""The router's models: those of ``--models-dir``, found the way llama-server finds them, and presets.

A ``NAME.gguf`` file in the directory is the model ``NAME``; a subdirectory
``NAME/`` holding GGUFs is the model ``NAME`` (multi-file models): its first
shard (``…-00001-of-…``) or else its one other GGUF is the file to load.
Files whose name contains ``mmproj`` are multimodal projectors, never a
model: the one in a model's subdirectory is loaded with it (``--mmproj``),
as llama-server does. A name with a comma is skipped (with a
warning): ``--served-model-name`` reads commas as separators between names.

A ``--models-preset`` section (``presets.py``) gives a directory model its
settings, aliases and tags, or adds a model of its own (its ``model`` file).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import attrs

from bubo.config import ConfigError, RouterSettings

from .presets import Preset, read_presets

__all__ = ["CatalogEntry", "build_catalog", "load_catalog", "scan_models_dir"]

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
    projector: Path | None = None  # the multimodal projector in its subdirectory (the child's --mmproj)
    args: tuple[str, ...] = ()  # its preset's flags for the child
    aliases: tuple[str, ...] = ()  # more names requests may use
    tags: tuple[str, ...] = ()  # informational
    load_on_startup: bool = False
    stop_timeout: float | None = None  # seconds it may drain when unloaded; None: --shutdown-timeout
    listed: bool = True  # False: hidden from GET /models by a preset's dedup-cache-models (still served)

    @property
    def names(self) -> tuple[str, ...]:
        """Its name, then its aliases: every name a request may use for it."""
        return (self.name, *self.aliases)


def load_catalog(settings: RouterSettings) -> tuple[CatalogEntry, ...]:
    """The catalog of ``--models-dir`` and ``--models-preset`` as they are now.

    Read at start, and again for ``GET /models?reload=1``.

    Raises:
        ConfigError: the preset file is refused.

    """
    presets = read_presets(settings.models_preset) if settings.models_preset is not None else ()
    return build_catalog(settings.models_dir, presets)


def build_catalog(directory: Path | None, presets: tuple[Preset, ...]) -> tuple[CatalogEntry, ...]:
    """The models of *directory* (if any) with *presets* applied, and the presets' own models.

    Raises:
        ConfigError: a preset that names no model of the directory has no ``model`` file (or one that
            is not a GGUF), or two models claim one name.

    """
    entries = {entry.name: entry for entry in (scan_models_dir(directory) if directory is not None else ())}
    for preset in presets:
        base = entries.get(preset.name)
        path = preset.model if preset.model is not None else (base.path if base is not None else None)
        if path is None:
            raise ConfigError(
                f"--models-preset [{preset.name}]: no model of --models-dir has this name; give its file "
                "with model = PATH (Bubo loads local GGUF files only)"
            )
        if not _is_gguf(path):
            raise ConfigError(f"--models-preset [{preset.name}] model: not a GGUF file: {path}")
        entries[preset.name] = CatalogEntry(
            name=preset.name,
            path=path,
            projector=base.projector if base is not None else None,
            args=preset.args,
            aliases=preset.aliases,
            tags=preset.tags,
            load_on_startup=preset.load_on_startup,
            stop_timeout=preset.stop_timeout,
        )
        if preset.dedup:  # the directory's entry of the same file is not listed twice
            for name, entry in entries.items():
                if name != preset.name and _same_file(entry.path, path):
                    entries[name] = attrs.evolve(entry, listed=False)
    _check_names(entries.values())
    return tuple(entries.values())


def _check_names(entries: Iterable[CatalogEntry]) -> None:
    owners: dict[str, str] = {}
    for entry in entries:
        for name in entry.names:
            if NAME_SEPARATOR in name:
                raise ConfigError(f"model name {name!r} of {entry.name!r}: a name cannot contain a comma")
            if owners.setdefault(name, entry.name) != entry.name:
                raise ConfigError(f"the name {name!r} is both {owners[name]!r}'s and {entry.name!r}'s")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


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
