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

This module imports nothing native: the payload is any buffer (a ctypes
array from llama.cpp, a bytearray read back).
"""

from __future__ import annotations

import array
import collections
import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from .lora import NO_ADAPTERS, AdapterSet, adapter_set_from_json
from .slots import common_prefix

__all__ = ["STALE_TEMPORARY_S", "WRITER_THREAD_NAME", "DiskEntry", "DiskTier", "kv_identity"]

logger = logging.getLogger(__name__)

MAGIC = b"BUBOKVC1"
SUFFIX = ".kvc"
WRITER_THREAD_NAME = "bubo-prompt-cache-writer"
STALE_TEMPORARY_S = 3600.0
"""A temporary file untouched this long is a write cut short, not one in progress (here or elsewhere)."""
DEFAULT_MAX_AGE_S = 7 * 86400.0
_IDENTITY_DIR = re.compile(r"[0-9a-f]{32}")
_LENGTH = struct.Struct("<I")
_MAX_HEADER = 4096
_TOKEN = "i"  # noqa: S105 - the array type code of a token id: int32, as llama_token
_FORMAT = 1
# Regions of the model file the identity reads: the start (header, metadata, first tensors), samples, the end.
_HEAD_BYTES = 8 << 20
_SAMPLE_BYTES = 1 << 20
_SAMPLES = 7


def kv_identity(model_path: Path, settings: Mapping[str, object]) -> str:
    """A hex digest of the model file and the *settings* that change the KV cells (blocking: reads the file).

    The file is identified by its size and a sample of its bytes (the first 8 MiB, seven 1 MiB
    slices spread over it, the last 1 MiB), not by hashing gigabytes at every start.
    """
    size = model_path.stat().st_size
    digest = hashlib.sha256(
        json.dumps({"format": _FORMAT, "size": size, **settings}, sort_keys=True).encode()
    )
    offsets = [(0, _HEAD_BYTES)]
    offsets += [(size * k // (_SAMPLES + 1), _SAMPLE_BYTES) for k in range(1, _SAMPLES + 1)]
    offsets.append((max(0, size - _SAMPLE_BYTES), _SAMPLE_BYTES))
    with model_path.open("rb") as file:
        for offset, length in offsets:
            file.seek(offset)
            digest.update(file.read(length))
    return digest.hexdigest()


@attrs.define(eq=False)
class DiskEntry:
    """One snapshot file: its name, its tokens, its size, when it was last used (Unix time), its adapters."""

    name: str
    tokens: array.array[int]
    size_bytes: int
    last_used: float
    adapters: AdapterSet = NO_ADAPTERS  # the LoRA adapter set its cells were computed under


class _Rejected(Exception):
    """A file that is not a whole snapshot of this model and these settings."""


@attrs.define
class _Job:
    tokens: tuple[int, ...]
    data: memoryview  # bytes
    size: int
    adapters: AdapterSet = NO_ADAPTERS


@attrs.frozen
class _Head:
    """A snapshot file's header and tokens, read and checked."""

    tokens: array.array[int]
    payload_bytes: int
    sha256: str
    header_bytes: int
    adapters: AdapterSet = NO_ADAPTERS

    @property
    def file_size(self) -> int:
        """The size of the whole file."""
        return len(MAGIC) + _LENGTH.size + self.header_bytes + 4 * len(self.tokens) + self.payload_bytes


class DiskTier:
    """Snapshot files under a byte budget, written by a thread of their own.

    :meth:`put` (the decode thread) only queues; :meth:`best` and :meth:`read`
    run in worker threads; one lock guards the index they all share.
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
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.max_age_s = max_age_s
        self.root = directory
        self.directory = directory / identity[:32]
        self._max_pending = max_pending_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._entries: collections.OrderedDict[str, DiskEntry] = collections.OrderedDict()  # oldest first
        self._bytes = 0
        self._jobs: collections.deque[_Job] = collections.deque()
        self._pending_bytes = 0
        self._writing: _Job | None = None  # the job the writer thread has taken
        self._closing = False
        self._thread: threading.Thread | None = None
        _make_private_dir(directory)
        _make_private_dir(self.directory)
        os.utime(self.directory)  # in use from now: no other server prunes it as unused
        self._scan()

    # ---- what is held (any thread) -------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        """Bytes of the files held."""
        return self._bytes

    def entries(self) -> list[DiskEntry]:
        """The files held, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def holds(self, tokens: Sequence[int], adapters: AdapterSet = NO_ADAPTERS) -> bool:
        """Whether a file of exactly *tokens* under *adapters* is held, being written, or queued."""
        name, exact = self._name(_pack(tokens), adapters), tuple(tokens)

        def same(job: _Job | None) -> bool:
            return job is not None and job.tokens == exact and job.adapters == adapters

        with self._lock:
            return name in self._entries or same(self._writing) or any(same(job) for job in self._jobs)

    def best(
        self, prompt: Sequence[int], adapters: AdapterSet = NO_ADAPTERS, *, max_tokens: int
    ) -> tuple[DiskEntry | None, int]:
        """The file under *adapters* sharing the longest prefix with *prompt* (at most ``len(prompt) - 1``).

        Returns it and that length.  Only files of fewer than *max_tokens* tokens count (a
        sequence could not hold the others), and only those computed under the same LoRA set.
        """
        limit = len(prompt) - 1
        best, best_len = None, 0
        for entry in self.entries():
            if len(entry.tokens) >= max_tokens or entry.adapters != adapters:
                continue
            match = common_prefix(entry.tokens, prompt, limit)
            if match > best_len:
                best, best_len = entry, match
        return best, best_len

    # ---- reading (a worker thread) ---------------------------------------------------------------

    def read(self, entry: DiskEntry) -> bytearray | None:
        """*entry*'s payload, checked; None (the file logged and deleted) if it is not whole and ours."""
        path = self._path(entry.name)
        try:
            payload = self._read_payload(path, entry)
        except FileNotFoundError:  # evicted or superseded since it was chosen
            self._delete(entry.name, path)
            return None
        except (OSError, _Rejected) as error:
            self._discard(entry.name, path, error)
            return None
        now = time.time()
        with contextlib.suppress(OSError):  # deleted meanwhile: the payload read is still whole
            os.utime(path, (now, now))
        with self._lock:
            if entry.name in self._entries:
                self._entries.move_to_end(entry.name)
                entry.last_used = now
        return payload

    def _read_payload(self, path: Path, entry: DiskEntry) -> bytearray:
        with path.open("rb") as file:
            head = self._read_head(file)
            if head.tokens != entry.tokens or head.adapters != entry.adapters:
                raise _Rejected("its tokens are not those it was indexed with")
            payload = bytearray(head.payload_bytes)
            if file.readinto(payload) != len(payload) or file.read(1):
                raise _Rejected("its size does not match its header")
        digest = hashlib.sha256(head.tokens.tobytes())
        digest.update(payload)
        if digest.hexdigest() != head.sha256:
            raise _Rejected("its checksum does not match")
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
        tokens = _pack(job.tokens)
        name = self._name(tokens, job.adapters)
        digest = hashlib.sha256(tokens.tobytes())
        digest.update(job.data)
        header = json.dumps(
            {
                "identity": self.identity,
                "adapters": [[adapter, scale] for adapter, scale in job.adapters],
                "n_tokens": len(tokens),
                "payload_bytes": job.size,
                "sha256": digest.hexdigest(),
            }
        ).encode()
        path = self._path(name)
        temporary = self.directory / f".{name}.{os.getpid()}.tmp"
        _make_private_dir(self.directory)  # another server may have pruned it as unused meanwhile
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(temporary, flags, 0o600), "wb") as file:
            file.write(MAGIC + _LENGTH.pack(len(header)) + header)
            file.write(tokens.tobytes())
            file.write(job.data)
        temporary.replace(path)
        size = path.stat().st_size
        with self._lock:
            old = self._entries.pop(name, None)
            self._bytes -= old.size_bytes if old else 0
            self._entries[name] = DiskEntry(
                name=name, tokens=tokens, size_bytes=size, last_used=time.time(), adapters=job.adapters
            )
            self._bytes += size
            superseded = [
                e.name
                for e in self._entries.values()
                if e.name != name and e.adapters == job.adapters and _extends(tokens, e.tokens)
            ]
        for other in superseded:
            self._delete(other)
        self._hold_budget()

    # ---- the index -------------------------------------------------------------------------------

    def _scan(self) -> None:
        """Index the files of earlier runs (oldest use first); delete broken ones and old leftovers."""
        found: list[DiskEntry] = []
        stale = time.time() - STALE_TEMPORARY_S
        for path in self.directory.iterdir():
            if not path.is_file() or path.is_symlink():
                continue
            if _is_temporary(path):
                with contextlib.suppress(OSError):  # another server's write in progress is younger
                    if path.stat().st_mtime < stale:
                        path.unlink()  # a write cut short
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                found.append(self._index(path))
            except FileNotFoundError:
                continue  # another server sharing the directory deleted it meanwhile
            except (OSError, _Rejected) as error:
                self._discard(path.stem, path, error)
        for entry in sorted(found, key=lambda e: e.last_used):
            self._entries[entry.name] = entry
            self._bytes += entry.size_bytes
        self._hold_budget()

    def _index(self, path: Path) -> DiskEntry:
        """The entry of a file found at start (its header and size checked, not yet its checksum)."""
        with path.open("rb") as file:
            head = self._read_head(file)
        stat = path.stat()
        if stat.st_size != head.file_size:
            raise _Rejected("its size does not match its header")
        if path.stem != self._name(head.tokens, head.adapters):
            raise _Rejected("its name is not its tokens' hash")
        return DiskEntry(
            name=path.stem,
            tokens=head.tokens,
            size_bytes=stat.st_size,
            last_used=stat.st_mtime,
            adapters=head.adapters,
        )

    def _read_head(self, file: BinaryIO) -> _Head:
        """The header and tokens of an open snapshot file, checked against this tier's identity."""
        start = file.read(len(MAGIC) + _LENGTH.size)
        if len(start) < len(MAGIC) + _LENGTH.size or not start.startswith(MAGIC):
            raise _Rejected("it is not a prompt-cache file")
        (length,) = _LENGTH.unpack_from(start, len(MAGIC))
        if length > _MAX_HEADER:
            raise _Rejected("its header is too long")
        try:
            header = json.loads(file.read(length))
            identity, n_tokens, n_bytes, sha256 = (
                header["identity"],
                header["n_tokens"],
                header["payload_bytes"],
                header["sha256"],
            )
            adapters = adapter_set_from_json(header["adapters"])
        except (ValueError, KeyError, TypeError):
            raise _Rejected("its header is not readable") from None
        if identity != self.identity:
            raise _Rejected("it was written for another model or other settings")
        if not (isinstance(n_tokens, int) and isinstance(n_bytes, int) and isinstance(sha256, str)):
            raise _Rejected("its header is not readable")
        if n_tokens <= 0 or n_bytes <= 0:
            raise _Rejected("its header is not readable")
        raw = file.read(n_tokens * 4)
        if len(raw) != n_tokens * 4:
            raise _Rejected("it is cut short")
        tokens = array.array(_TOKEN)
        tokens.frombytes(raw)
        return _Head(
            tokens=tokens, payload_bytes=n_bytes, sha256=sha256, header_bytes=length, adapters=adapters
        )

    def _hold_budget(self) -> None:
        """Delete the tree's least recently used files until every identity's files fit the budget.

        Runs where files are written (the writer thread, or the constructor before it starts),
        so none of this tier's own files is half written; other servers' half-written files
        have temporary names and are not counted.
        """
        files = self._census()
        total = sum(file.size for file in files)
        if total <= self.budget_bytes:
            return
        for file in sorted(files, key=lambda f: f.last_used):
            if total <= self.budget_bytes:
                return
            if file.path.parent == self.directory:
                self._delete(file.path.stem, file.path)
            else:
                _unlink_quietly(file.path)
            total -= file.size

    def _census(self) -> list[_TreeFile]:
        """Every whole snapshot file in the tree; another identity's directory unused too long is pruned.

        This tier's index forgets its files that are gone (another server sharing the tree
        deleted them).
        """
        found: list[_TreeFile] = []
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
        here = {file.path.stem for file in found if file.path.parent == self.directory}
        with self._lock:
            for name in [name for name in self._entries if name not in here]:
                self._bytes -= self._entries.pop(name).size_bytes
        return found

    def _discard(self, name: str, path: Path, error: BaseException) -> None:
        logger.warning("prompt-cache file %s skipped and deleted: %s", path.name, error)
        self._delete(name, path)

    def _delete(self, name: str, path: Path | None = None) -> None:
        with self._lock:
            entry = self._entries.pop(name, None)
            if entry is not None:
                self._bytes -= entry.size_bytes
        try:
            (path or self._path(name)).unlink(missing_ok=True)
        except OSError as error:
            logger.warning("could not delete the prompt-cache file %s: %s", name, error)

    def _name(self, tokens: array.array[int], adapters: AdapterSet) -> str:
        digest = hashlib.sha256(self.identity.encode())
        digest.update(json.dumps([[adapter, scale] for adapter, scale in adapters]).encode())
        digest.update(tokens.tobytes())
        return digest.hexdigest()[:40]

    def _path(self, name: str) -> Path:
        return self.directory / (name + SUFFIX)


@attrs.frozen
class _TreeFile:
    """A whole snapshot file somewhere in the tree, of any identity."""

    path: Path
    size: int
    last_used: float  # its modification time


def _is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(".tmp")


def _listing(directory: Path) -> tuple[list[_TreeFile], float]:
    """*directory*'s whole snapshot files, and when it was last used (its own or its newest file's time)."""
    files: list[_TreeFile] = []
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
        files.append(_TreeFile(Path(entry.path), stat.st_size, stat.st_mtime))
        last_used = max(last_used, stat.st_mtime)
    return files, last_used


def _prune(directory: Path, files: list[_TreeFile], *, stale_before: float) -> None:
    """Delete an unused identity directory: its snapshot files, old temporary files, then itself if empty."""
    for file in files:
        _unlink_quietly(file.path)
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            with contextlib.suppress(OSError):
                if _is_temporary(path) and path.lstat().st_mtime < stale_before:
                    path.unlink()
    with contextlib.suppress(OSError):  # not empty: something else lives there, or a server just began
        directory.rmdir()
        logger.info("deleted the prompt-cache directory %s, unused for too long", directory.name)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        logger.warning("could not delete the prompt-cache file %s: %s", path, error)


def _pack(tokens: Sequence[int]) -> array.array[int]:
    packed = array.array(_TOKEN, tokens)
    if packed.itemsize != 4:  # pragma: no cover - int is 32 bits on every platform llama.cpp runs on
        raise RuntimeError("int32 tokens expected")
    return packed


def _extends(longer: array.array[int], shorter: array.array[int]) -> bool:
    return len(shorter) < len(longer) and longer[: len(shorter)] == shorter


def _make_private_dir(path: Path) -> None:
    """Create *path* (and its parents) if missing; make it ``0700`` (only this user reads snapshots)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
