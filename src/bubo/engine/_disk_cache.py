"""The prompt cache's disk tier: sequence snapshots in files that outlive the process.

Beside the host-RAM snapshots (:mod:`._kv`), every snapshot taken is also
handed to a :class:`DiskTier`, whose own writer thread puts it in a file; the
decode thread only queues the bytes it already took.  After a restart the
files are found again, and a request whose prompt begins like one of them
gets it read (in a worker thread, before its generation reaches the decode
thread), checked, and restored instead of reading the prefix again.

Where the files are: ``DIR/<identity>/<name>.kvc``.  The identity
(:func:`kv_identity`) hashes what makes a sequence's KV cells mean the same:
the model file (its size and sampled contents), llama.cpp's version and its
state format, and the context settings that change the cells (KV types,
RoPE, flash attention, the sliding-window cache).  A model or a setting that
differs therefore looks in another directory, and a file found in the wrong
one is refused by the identity in its header.  A file also records the LoRA
adapter set its cells were computed under (``(id, scale)`` pairs; the
adapter files themselves are part of the identity) and is offered only to a
prompt under the same set.  ``name`` is a hash of the identity, the adapter
set and the tokens, never anything a request chose.  Directories are
created ``0700``, files ``0600``.

A file is ``MAGIC``, a 4-byte header length, a JSON header (identity,
adapter set, token count, payload size, SHA-256 of tokens and payload), the tokens as
little-endian int32, then llama.cpp's sequence state.  It is written to a
temporary name and renamed, so a reader sees a whole file or none; one cut
short by a crash or altered on disk fails its size or checksum check, is
logged and deleted, and is never given to llama.cpp.  A file whose tokens
another one extends is deleted.

One byte budget holds over the whole tree, every identity's directory
together (each model or setting used to keep a budget of its own, and an
upgrade or a ``-ctk`` change left the old directory behind for good): at start
and after each write the writer thread lists every identity directory and
deletes the least recently used files of the tree until it fits (a restore
counts as a use, kept in the file's modification time, which other servers
sharing the directory read too).  A directory of another identity unused for
``max_age_s`` (its files' and its own modification times) is deleted whole.
Another server may be running on the same tree: only whole, renamed snapshot
files are ever deleted (a temporary file only once it is
:data:`STALE_TEMPORARY_S` old, long after any write), a file that vanishes
meanwhile is skipped, and a directory is removed only once it is empty.

The file format is :mod:`._disk_format`'s, what is held :mod:`._disk_index`'s
and the tree's listing and budget :mod:`._disk_tree`'s; :class:`DiskTier` queues,
writes, reads and deletes.  None of them imports anything native: the payload
is any buffer (a ctypes array from llama.cpp, a bytearray read back).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from ._disk_format import MAGIC, SUFFIX, DiskEntry, Rejected, SnapshotFileFormat, kv_identity, pack_tokens
from ._disk_index import DiskIndex
from ._disk_tree import DiskTree, unlink_quietly
from .lora import NO_ADAPTERS, AdapterSet

__all__ = ["MAGIC", "STALE_TEMPORARY_S", "WRITER_THREAD_NAME", "DiskEntry", "DiskTier", "kv_identity"]

logger = logging.getLogger(__name__)

WRITER_THREAD_NAME = "bubo-prompt-cache-writer"
STALE_TEMPORARY_S = 3600.0
"""A temporary file untouched this long is a write cut short, not one in progress (here or elsewhere)."""
DEFAULT_MAX_AGE_S = 7 * 86400.0


@attrs.define
class _Job:
    tokens: tuple[int, ...]
    data: memoryview  # bytes
    size: int
    adapters: AdapterSet = NO_ADAPTERS


class DiskTier:
    """Snapshot files under a byte budget, written by a thread of their own.

    :meth:`put` (the decode thread) only queues; :meth:`best` and :meth:`read`
    run in worker threads.  What is held is a :class:`~._disk_index.DiskIndex`;
    the file format is :class:`~._disk_format.SnapshotFileFormat`'s, and the
    budget over the whole tree :class:`~._disk_tree.DiskTree`'s.
    """

    def __init__(
        self,
        directory: Path,
        *,
        identity: str,
        budget_bytes: int,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_pending_bytes: int = 512 << 20,
    ) -> None:
        """Use (and create, ``0700``) ``directory/identity[:32]``; index the files already there.

        *budget_bytes* holds over every identity's files under *directory*; another identity's
        directory unused for *max_age_s* seconds is deleted.
        """
        self.budget_bytes = budget_bytes
        self.directory = directory / identity[:32]
        self._format = SnapshotFileFormat(identity)
        self._tree = DiskTree(directory, self.directory, max_age_s=max_age_s)
        self._max_pending = max_pending_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._index = DiskIndex()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._pending_bytes = 0
        self._writing: _Job | None = None  # the job the writer thread has taken
        self._closing = False
        self._thread: threading.Thread | None = None
        _make_private_dir(directory)
        _make_private_dir(self.directory)
        os.utime(self.directory)  # in use from now: no other server prunes it as unused
        self._index.found(self._tree.own_files(self._format, stale_before=time.time() - STALE_TEMPORARY_S))
        self._hold_budget()

    # ---- what is held (any thread) -------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        """Bytes of the files held."""
        return self._index.total_bytes

    def entries(self) -> list[DiskEntry]:
        """The files held, least recently used first."""
        return self._index.entries()

    def holds(self, tokens: Sequence[int], adapters: AdapterSet = NO_ADAPTERS) -> bool:
        """Whether a file of exactly *tokens* under *adapters* is held, being written, or queued.

        The queue is asked first: the writer indexes a file before it lets go of its job.
        """
        name, exact = self._format.name(pack_tokens(tokens), adapters), tuple(tokens)

        def same(job: _Job | None) -> bool:
            return job is not None and job.tokens == exact and job.adapters == adapters

        with self._lock:
            if same(self._writing) or any(same(job) for job in self._jobs):
                return True
        return name in self._index

    def best(
        self, prompt: Sequence[int], adapters: AdapterSet = NO_ADAPTERS, *, max_tokens: int
    ) -> tuple[DiskEntry | None, int]:
        """See :meth:`~._disk_index.DiskIndex.best` (the file to read for *prompt*, and its match)."""
        return self._index.best(prompt, adapters, max_tokens=max_tokens)

    # ---- reading (a worker thread) ---------------------------------------------------------------

    def read(self, entry: DiskEntry) -> bytearray | None:
        """*entry*'s payload, checked; None (the file logged and deleted) if it is not whole and ours."""
        path = self._path(entry.name)
        try:
            payload = self._format.read_payload(path, entry)
        except FileNotFoundError:  # evicted or superseded since it was chosen
            self._delete(entry.name, path)
            return None
        except (OSError, Rejected) as error:
            self._discard(entry.name, path, error)
            return None
        now = time.time()
        with contextlib.suppress(OSError):  # deleted meanwhile: the payload read is still whole
            os.utime(path, (now, now))
        self._index.used(entry, now)
        return payload

    # ---- writing -------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int], data: memoryview, adapters: AdapterSet = NO_ADAPTERS) -> None:
        """Queue a file of *tokens* and the sequence state *data* (left unchanged from now on).

        *adapters*: the LoRA adapter set the state was computed under.

        Returns at once (the decode thread calls it); a snapshot over the budget, or one that
        would queue more bytes than the writer may hold back, is dropped.
        """
        data = data.cast("B")
        size = data.nbytes
        with self._lock:
            if self._closing or size > self.budget_bytes:
                return
            if self._pending_bytes + size > self._max_pending:
                logger.debug("prompt-cache writer busy: a snapshot of %d tokens is not written", len(tokens))
                return
            self._jobs.append(_Job(tuple(tokens), data, size, adapters))
            self._pending_bytes += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=WRITER_THREAD_NAME, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Block until every queued file is written (at most *timeout_s*); whether they were."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._jobs and self._writing is None, timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (within *timeout_s*), then stop the writer."""
        self.flush(timeout_s)
        with self._lock:
            self._closing = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._changed.wait_for(lambda: self._jobs or self._closing)
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._writing = job
            try:
                self._write(job)
            except Exception:
                logger.exception("could not write a prompt-cache file")
            finally:
                with self._lock:
                    self._writing = None
                    self._pending_bytes -= job.size
                    self._changed.notify_all()

    def _write(self, job: _Job) -> None:
        """Write *job*'s file (on the writer thread), then make room for it under the budget."""
        tokens = pack_tokens(job.tokens)
        name = self._format.name(tokens, job.adapters)
        path = self._path(name)
        temporary = self.directory / f".{name}.{os.getpid()}.tmp"
        _make_private_dir(self.directory)  # another server may have pruned it as unused meanwhile
        self._format.write(temporary, path, tokens, job.data, job.adapters)
        size = path.stat().st_size
        superseded = self._index.add(
            DiskEntry(name=name, tokens=tokens, size_bytes=size, last_used=time.time(), adapters=job.adapters)
        )
        for other in superseded:
            self._delete(other)
        self._hold_budget()

    # ---- the budget, deleting -------------------------------------------------------------------

    def _hold_budget(self) -> None:
        """Delete the tree's least recently used files until every identity's files fit the budget.

        Runs where files are written (the writer thread, or the constructor before it starts),
        so none of this tier's own files is half written; other servers' half-written files
        have temporary names and are not counted.  The index first forgets its files that are
        gone (another server sharing the tree deleted them).
        """
        files = self._tree.census()
        here = {file.path.stem for file in files if file.path.parent == self.directory}
        self._index.keep_only(here)
        for file in self._tree.excess(files, self.budget_bytes):
            if file.path.parent == self.directory:
                self._delete(file.path.stem, file.path)
            else:
                unlink_quietly(file.path)

    def _discard(self, name: str, path: Path, error: BaseException) -> None:
        logger.warning("prompt-cache file %s skipped and deleted: %s", path.name, error)
        self._delete(name, path)

    def _delete(self, name: str, path: Path | None = None) -> None:
        self._index.pop(name)
        try:
            (path or self._path(name)).unlink(missing_ok=True)
        except OSError as error:
            logger.warning("could not delete the prompt-cache file %s: %s", name, error)

    def _path(self, name: str) -> Path:
        return self.directory / (name + SUFFIX)


def _make_private_dir(path: Path) -> None:
    """Create *path* (and its parents) if missing; make it ``0700`` (only this user reads snapshots)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
