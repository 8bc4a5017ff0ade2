"""The slot files' directory (``--slot-save-path``): names, records, checksums and the quota.

A slot file is llama.cpp's own state file (``llama_state_seq_save_file``: the
sequence's tokens and KV cells) under the name a client chose, and beside it
``<name>.bubo.json``, its record: the fingerprint of the model and settings
that computed the cells (:func:`model_fingerprint`: the SHA-256 of the whole
model file, read once at load, with the engine's ``state_identity``: llama.cpp's
state format, the KV types, the LoRA adapter files), the LoRA adapter set the
cells were computed under, the token count, and the state file's size and
SHA-256.  llama.cpp's file names no model, and a state of another model of the
same shape (two fine-tunes of one base, which may differ anywhere in their
tensors) would load as meaningless cells.

Writing (:meth:`SlotFileStore.commit`): the engine writes the state to a
temporary name in the directory; its checksum is taken and the quota checked
with its real size; the record is written to a temporary name too; then the
old record goes and the state and the record are renamed into place.  A
reader sees whole files or none, and a crash leaves a state without a record
(refused on restore) or a temporary file (swept at the next start, once
:data:`STALE_TEMPORARY_S` old, so another server's save in progress is never
taken).

Reading (:meth:`SlotFileStore.pin`): the file is hard-linked into a private
directory (copied where the file system has no hard links), and that link is
what is checked and handed to llama.cpp.  A save of the same name meanwhile,
by this server or another one sharing the directory, renames a new file onto
the name and cannot change the bytes that were checked.

The quota counts the regular files directly in the directory: at most
``max_files`` slot files (records and temporary files are not counted as
files) and ``max_bytes`` bytes in all (records and temporary files included).
A save past either is refused with 507 ``slot_quota_exceeded`` and writes
nothing.  Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import attrs
import trio

from bubo.engine.lora import AdapterSet, adapter_set_from_json
from bubo.errors import BuboError, InvalidRequest

__all__ = [
    "RECORD_SUFFIX",
    "STALE_TEMPORARY_S",
    "DirectoryUsage",
    "SlotFileStore",
    "SlotQuotaExceeded",
    "SlotRecord",
    "model_fingerprint",
]

RECORD_SUFFIX = ".bubo.json"
STALE_TEMPORARY_S = 3600.0
"""A temporary file or restore directory untouched this long belongs to no save or restore in progress."""
_FORMAT = "bubo-slot-file"
_VERSION = 2
_MAX_RECORD_BYTES = 64 << 10
_TEMPORARY_PREFIX = ".slot-"
_TEMPORARY_SUFFIX = ".tmp"
_RESTORE_PREFIX = ".restore-"
_CHUNK = 1 << 20


class SlotQuotaExceeded(BuboError):
    """A save would take the slot directory past its byte or file quota (507)."""

    status = 507
    type = "server_error"
    default_code = "slot_quota_exceeded"


@attrs.frozen(kw_only=True)
class SlotRecord:
    """What ``<name>.bubo.json`` says of the state file beside it."""

    fingerprint: str  # the store's model_fingerprint when it was saved
    model: str  # the model's description, for messages
    adapters: AdapterSet  # the LoRA adapter set its cells were computed under: (id, scale) pairs
    n_tokens: int
    size_bytes: int
    sha256: str

    def to_json(self) -> str:
        """The record file's text."""
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "fingerprint": self.fingerprint,
                "model": self.model,
                "adapters": [[adapter, scale] for adapter, scale in self.adapters],
                "n_tokens": self.n_tokens,
                "size_bytes": self.size_bytes,
                "sha256": self.sha256,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SlotRecord:
        """Read a record file's text (ValueError or TypeError if it is not one of this format)."""
        value = json.loads(text)
        if not isinstance(value, dict) or value.get("format") != _FORMAT or value.get("version") != _VERSION:
            raise ValueError("not a record of this format")
        fingerprint, model, sha256 = value.get("fingerprint"), value.get("model"), value.get("sha256")
        n_tokens, size_bytes = value.get("n_tokens"), value.get("size_bytes")
        if not (isinstance(fingerprint, str) and isinstance(model, str) and isinstance(sha256, str)):
            raise TypeError("a field is not a string")
        if not (type(n_tokens) is int and type(size_bytes) is int):
            raise TypeError("a count is not a whole number")
        if n_tokens < 0 or size_bytes < 0:
            raise ValueError("a count is negative")
        return cls(
            fingerprint=fingerprint,
            model=model,
            adapters=adapter_set_from_json(value.get("adapters")),
            n_tokens=n_tokens,
            size_bytes=size_bytes,
            sha256=sha256,
        )


@attrs.frozen
class DirectoryUsage:
    """What the slot directory holds, as the quota counts it."""

    n_files: int  # slot files (records and temporary files not counted)
    n_bytes: int  # every regular file's bytes


def model_fingerprint(model_path: Path, state_identity: str) -> str:
    """The fingerprint slot records carry: the whole model file's SHA-256 with *state_identity*.

    Blocking: it reads every byte of the model once (about a second a GiB), which is why the
    loader calls it only with ``--slot-save-path``.  The prompt cache's ``state_identity``
    alone samples the file, which two fine-tunes of one base can pass.
    """
    digest = hashlib.sha256()
    with model_path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return hashlib.sha256(f"{digest.hexdigest()}:{state_identity}".encode()).hexdigest()


@attrs.frozen(kw_only=True)
class SlotFileStore:
    """The slot directory and its quota; ``save_lock`` makes this server's saves take turns.

    Saves take turns so that two of them cannot both pass the quota with room for one.
    """

    directory: Path
    max_bytes: int
    max_files: int
    fingerprint: str  # the served model's and settings' (model_fingerprint), which records name
    save_lock: trio.Lock = attrs.field(factory=trio.Lock, eq=False, repr=False)

    def path(self, name: str) -> Path:
        """The state file of the (checked, plain) *name*."""
        return self.directory / name

    def record_path(self, name: str) -> Path:
        """The record beside *name*'s state file."""
        return self.directory / (name + RECORD_SUFFIX)

    # ---- the directory ---------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory (``0700``) if missing; delete this store's stale temporary files."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        stale = time.time() - STALE_TEMPORARY_S
        for entry in os.scandir(self.directory):
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to delete
                if entry.stat(follow_symlinks=False).st_mtime >= stale:
                    continue
                if entry.name.startswith(_TEMPORARY_PREFIX) and entry.is_file(follow_symlinks=False):
                    Path(entry.path).unlink()
                elif entry.name.startswith(_RESTORE_PREFIX) and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)

    def usage(self, *, leaving: str | None = None, written: Path | None = None) -> DirectoryUsage:
        """What the directory holds, less *leaving*'s files (a save replaces them) and *written*."""
        replaced = {leaving, leaving + RECORD_SUFFIX} if leaving is not None else set()
        if written is not None:
            replaced.add(written.name)
        n_files = n_bytes = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name in replaced:
                    continue
                try:
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    n_bytes += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
                if not entry.name.startswith(".") and not entry.name.endswith(RECORD_SUFFIX):
                    n_files += 1
        return DirectoryUsage(n_files=n_files, n_bytes=n_bytes)

    def check_room(self, name: str, new_bytes: int = 0, *, written: Path | None = None) -> None:
        """Refuse (507) a save of *name* of *new_bytes* (0: not yet known) that would pass the quota.

        *written*: the temporary file the new bytes are in (not counted twice).

        Raises:
            SlotQuotaExceeded: the directory has no room for it.

        """
        usage = self.usage(leaving=name, written=written)
        if usage.n_files + 1 > self.max_files:
            raise SlotQuotaExceeded(
                f"the slot directory holds {usage.n_files} files, its most (--slot-save-max-files "
                f"{self.max_files}); delete some, save under the name of one, or raise the limit",
                param="filename",
            )
        if usage.n_bytes + new_bytes > self.max_bytes or (new_bytes == 0 and usage.n_bytes >= self.max_bytes):
            raise SlotQuotaExceeded(
                f"the slot directory would hold {_mib(usage.n_bytes + new_bytes)} MiB, past its quota "
                f"(--slot-save-max-mib {_mib(self.max_bytes)}); delete some files or raise the limit",
                param="filename",
            )

    def temporary(self) -> Path:
        """A fresh temporary name in the directory for the engine to write a state to."""
        return self.directory / f"{_TEMPORARY_PREFIX}{secrets.token_hex(8)}{_TEMPORARY_SUFFIX}"

    # ---- writing ---------------------------------------------------------------------------------

    def commit(
        self, name: str, written: Path, *, fingerprint: str, model: str, adapters: AdapterSet, n_tokens: int
    ) -> SlotRecord:
        """Give the state the engine *written* (a :meth:`temporary` name) its record and the name *name*.

        Raises:
            SlotQuotaExceeded: the directory has no room for it (*written* is deleted).

        """
        written.chmod(0o600)  # llama.cpp creates it as the umask says: only this user reads KV states
        size, sha256 = _digest(written)
        record = SlotRecord(
            fingerprint=fingerprint,
            model=model,
            adapters=adapters,
            n_tokens=n_tokens,
            size_bytes=size,
            sha256=sha256,
        )
        text = record.to_json().encode()
        try:
            self.check_room(name, size + len(text), written=written)
        except SlotQuotaExceeded:
            written.unlink(missing_ok=True)
            raise
        record_written = self.temporary()
        try:
            with os.fdopen(_create(record_written), "wb") as file:
                file.write(text)
            self.record_path(name).unlink(missing_ok=True)  # from here the old pair is gone, never mixed
            written.replace(self.path(name))
            record_written.replace(self.record_path(name))
        finally:
            record_written.unlink(missing_ok=True)
        return record

    # ---- reading ---------------------------------------------------------------------------------

    def read_record(self, name: str, *, param: str = "filename") -> SlotRecord:
        """*name*'s record.

        Raises:
            InvalidRequest: there is no such file, or no readable record of this format beside it.

        """
        if not self.path(name).is_file():
            raise InvalidRequest(f"no slot file named {name!r} in the slot directory", param=param)
        try:
            with self.record_path(name).open("rb") as file:
                return SlotRecord.from_json(file.read(_MAX_RECORD_BYTES))
        except (OSError, ValueError, TypeError):
            raise InvalidRequest(
                f"{name!r} has no readable record of the model that saved it (saved by another program, "
                "by an older Bubo, or cut short): save it again",
                code="slot_file_invalid",
                param=param,
            ) from None

    def pin(self, name: str, *, param: str = "filename") -> Path:
        """A private link to *name*'s state file as it is now, with the file name *name* (:meth:`unpin` it).

        Raises:
            InvalidRequest: the file is gone.

        """
        private = Path(tempfile.mkdtemp(prefix=_RESTORE_PREFIX, dir=self.directory))
        link = private / name
        try:
            try:
                os.link(self.path(name), link)
            except FileNotFoundError:
                raise InvalidRequest(
                    f"no slot file named {name!r} in the slot directory", param=param
                ) from None
            except OSError:  # a file system without hard links: a private copy instead
                shutil.copyfile(self.path(name), link)
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        return link

    @staticmethod
    def unpin(link: Path) -> None:
        """Remove a link :meth:`pin` made, and its private directory."""
        shutil.rmtree(link.parent, ignore_errors=True)

    @staticmethod
    def verify(path: Path, record: SlotRecord, *, name: str, param: str = "filename") -> None:
        """Check that *path* holds the bytes *record* describes (its size, then its SHA-256).

        Raises:
            InvalidRequest: it does not (``slot_file_corrupt``): cut short, altered, or replaced.

        """
        size, sha256 = _digest(path)
        if size != record.size_bytes or sha256 != record.sha256:
            why = (
                f"{size} bytes instead of {record.size_bytes}"
                if size != record.size_bytes
                else "its checksum"
            )
            raise InvalidRequest(
                f"{name!r} is not the file that was saved ({why} does not match its record): it was cut "
                "short or altered; save it again",
                code="slot_file_corrupt",
                param=param,
            )


def _digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _create(path: Path) -> int:
    """A new file at *path*, ``0600``, never through a link."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):.1f}".removesuffix(".0")
