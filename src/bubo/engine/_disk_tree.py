"""The prompt-cache directory tree: every identity's directory, under one byte budget.

Each model or setting writes its files in a directory of its own
(``DIR/<identity>/``); one budget holds over all of them together, and a
directory of another identity unused for ``max_age_s`` is deleted whole.
:class:`DiskTree` lists what the tree holds and says which files to delete
to fit; :class:`~._disk_cache.DiskTier` deletes them (its own through its
index).  Another server may share the tree: a file that vanishes meanwhile
is skipped, and a directory is removed only once it is empty.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from ._disk_format import SUFFIX, DiskEntry, Rejected, SnapshotFileFormat

__all__ = ["DiskTree", "TreeFile", "is_temporary", "unlink_quietly"]

logger = logging.getLogger(__name__)

_IDENTITY_DIR = re.compile(r"[0-9a-f]{32}")


class DiskTree:
    """The identity directories under *root*, of which *directory* is this server's."""

    def __init__(self, root: Path, directory: Path, *, max_age_s: float) -> None:
        """Another identity's directory unused for *max_age_s* seconds is pruned by :meth:`census`."""
        self.root = root
        self.directory = directory
        self.max_age_s = max_age_s

    def own_files(self, file_format: SnapshotFileFormat, *, stale_before: float) -> list[DiskEntry]:
        """The files of earlier runs in this server's directory, indexed.

        Broken ones are logged and deleted, and temporary ones older than *stale_before*
        (writes cut short) deleted.
        """
        found: list[DiskEntry] = []
        for path in self.directory.iterdir():
            if not path.is_file() or path.is_symlink():
                continue
            if is_temporary(path):
                with contextlib.suppress(OSError):  # another server's write in progress is younger
                    if path.stat().st_mtime < stale_before:
                        path.unlink()  # a write cut short
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                found.append(file_format.index(path))
            except FileNotFoundError:
                continue  # another server sharing the directory deleted it meanwhile
            except (OSError, Rejected) as error:
                logger.warning("prompt-cache file %s skipped and deleted: %s", path.name, error)
                unlink_quietly(path)
        return found

    def census(self) -> list[TreeFile]:
        """Every whole snapshot file in the tree; another identity's directory unused too long is pruned."""
        found: list[TreeFile] = []
        now = time.time()
        try:
            directories = [path for path in self.root.iterdir() if _IDENTITY_DIR.fullmatch(path.name)]
        except OSError as error:
            logger.warning("could not list the prompt-cache directory %s: %s", self.root, error)
            directories = [self.directory]
        for directory in directories:
            if directory.is_symlink() or not directory.is_dir():
                continue
            files, last_used = _listing(directory)
            if directory != self.directory and last_used < now - self.max_age_s:
                _prune(directory, files, stale_before=now - self.max_age_s)
                continue
            found.extend(files)
        return found

    @staticmethod
    def excess(files: Sequence[TreeFile], budget_bytes: int) -> list[TreeFile]:
        """The least recently used of *files* to delete so that the rest fit *budget_bytes*."""
        total = sum(file.size for file in files)
        over: list[TreeFile] = []
        for file in sorted(files, key=lambda f: f.last_used):
            if total <= budget_bytes:
                break
            over.append(file)
            total -= file.size
        return over


@attrs.frozen
class TreeFile:
    """A whole snapshot file somewhere in the tree, of any identity."""

    path: Path
    size: int
    last_used: float  # its modification time


def is_temporary(path: Path) -> bool:
    """Whether *path* is a write in progress or cut short (``.NAME.PID.tmp``)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")


def _listing(directory: Path) -> tuple[list[TreeFile], float]:
    """*directory*'s whole snapshot files, and when it was last used (its own or its newest file's time)."""
    files: list[TreeFile] = []
    try:
        last_used = directory.stat().st_mtime
        entries = list(os.scandir(directory))
    except OSError:  # removed meanwhile
        return [], 0.0
    for entry in entries:
        if not entry.name.endswith(SUFFIX) or entry.name.startswith("."):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        files.append(TreeFile(Path(entry.path), stat.st_size, stat.st_mtime))
        last_used = max(last_used, stat.st_mtime)
    return files, last_used


def _prune(directory: Path, files: list[TreeFile], *, stale_before: float) -> None:
    """Delete an unused identity directory: its snapshot files, old temporary files, then itself if empty."""
    for file in files:
        unlink_quietly(file.path)
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            with contextlib.suppress(OSError):
                if is_temporary(path) and path.lstat().st_mtime < stale_before:
                    path.unlink()
    with contextlib.suppress(OSError):  # not empty: something else lives there, or a server just began
        directory.rmdir()
        logger.info("deleted the prompt-cache directory %s, unused for too long", directory.name)


def unlink_quietly(path: Path) -> None:
    """Delete *path* if it is there; a failure is logged, never raised."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        logger.warning("could not delete the prompt-cache file %s: %s", path, error)
