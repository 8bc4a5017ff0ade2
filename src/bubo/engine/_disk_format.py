"""The prompt cache's snapshot file: its format, its name, and the identity it is checked against.

A file is ``MAGIC``, a 4-byte header length, a JSON header (identity, adapter
set, token count, payload size, SHA-256 of tokens and payload), the tokens as
little-endian int32, then llama.cpp's sequence state.  The identity
(:func:`kv_identity`) hashes what makes a sequence's KV cells mean the same;
a file of another identity, one cut short or one altered is :class:`Rejected`.
:class:`~._disk_cache.DiskTier` decides which files to keep, read and delete;
this module only reads and writes one.  Nothing native, no state.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from .lora import NO_ADAPTERS, AdapterSet, adapter_set_from_json

__all__ = [
    "MAGIC",
    "SUFFIX",
    "DiskEntry",
    "FileHead",
    "Rejected",
    "SnapshotFileFormat",
    "kv_identity",
    "pack_tokens",
]

MAGIC = b"BUBOKVC1"
SUFFIX = ".kvc"
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


class Rejected(Exception):
    """A file that is not a whole snapshot of this model and these settings."""


@attrs.frozen
class FileHead:
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


class SnapshotFileFormat:
    """Snapshot files of one identity: named, written, and read back checked."""

    def __init__(self, identity: str) -> None:
        """*identity*: :func:`kv_identity`'s digest, written in every header and checked on every read."""
        self.identity = identity

    def name(self, tokens: array.array[int], adapters: AdapterSet) -> str:
        """A file's name: a hash of the identity, the adapter set and the tokens (nothing a request chose)."""
        digest = hashlib.sha256(self.identity.encode())
        digest.update(json.dumps([[adapter, scale] for adapter, scale in adapters]).encode())
        digest.update(tokens.tobytes())
        return digest.hexdigest()[:40]

    def write(
        self, temporary: Path, path: Path, tokens: array.array[int], data: memoryview, adapters: AdapterSet
    ) -> None:
        """Write a file of *tokens* and the state *data* to *temporary*, ``0600``, then rename it *path*.

        A reader sees a whole file or none.
        """
        digest = hashlib.sha256(tokens.tobytes())
        digest.update(data)
        header = json.dumps(
            {
                "identity": self.identity,
                "adapters": [[adapter, scale] for adapter, scale in adapters],
                "n_tokens": len(tokens),
                "payload_bytes": data.nbytes,
                "sha256": digest.hexdigest(),
            }
        ).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(temporary, flags, 0o600), "wb") as file:
            file.write(MAGIC + _LENGTH.pack(len(header)) + header)
            file.write(tokens.tobytes())
            file.write(data)
        temporary.replace(path)

    def index(self, path: Path) -> DiskEntry:
        """The entry of a file found at start (its header and size checked, not yet its checksum).

        Raises:
            Rejected: it is not a whole snapshot file of this identity, named for its tokens.
            OSError: it could not be read.

        """
        with path.open("rb") as file:
            head = self.read_head(file)
        stat = path.stat()
        if stat.st_size != head.file_size:
            raise Rejected("its size does not match its header")
        if path.stem != self.name(head.tokens, head.adapters):
            raise Rejected("its name is not its tokens' hash")
        return DiskEntry(
            name=path.stem,
            tokens=head.tokens,
            size_bytes=stat.st_size,
            last_used=stat.st_mtime,
            adapters=head.adapters,
        )

    def read_head(self, file: BinaryIO) -> FileHead:
        """The header and tokens of an open snapshot file, checked against this identity.

        Raises:
            Rejected: it is not a whole snapshot file of this identity.

        """
        start = file.read(len(MAGIC) + _LENGTH.size)
        if len(start) < len(MAGIC) + _LENGTH.size or not start.startswith(MAGIC):
            raise Rejected("it is not a prompt-cache file")
        (length,) = _LENGTH.unpack_from(start, len(MAGIC))
        if length > _MAX_HEADER:
            raise Rejected("its header is too long")
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
            raise Rejected("its header is not readable") from None
        if identity != self.identity:
            raise Rejected("it was written for another model or other settings")
        if not (isinstance(n_tokens, int) and isinstance(n_bytes, int) and isinstance(sha256, str)):
            raise Rejected("its header is not readable")
        if n_tokens <= 0 or n_bytes <= 0:
            raise Rejected("its header is not readable")
        raw = file.read(n_tokens * 4)
        if len(raw) != n_tokens * 4:
            raise Rejected("it is cut short")
        tokens = array.array(_TOKEN)
        tokens.frombytes(raw)
        return FileHead(
            tokens=tokens, payload_bytes=n_bytes, sha256=sha256, header_bytes=length, adapters=adapters
        )

    def read_payload(self, path: Path, entry: DiskEntry) -> bytearray:
        """*entry*'s payload from *path*, checked against its header, the entry and its checksum.

        Raises:
            Rejected: the file is not *entry*'s whole snapshot.
            OSError: it could not be read.

        """
        with path.open("rb") as file:
            head = self.read_head(file)
            if head.tokens != entry.tokens or head.adapters != entry.adapters:
                raise Rejected("its tokens are not those it was indexed with")
            payload = bytearray(head.payload_bytes)
            if file.readinto(payload) != len(payload) or file.read(1):
                raise Rejected("its size does not match its header")
        digest = hashlib.sha256(head.tokens.tobytes())
        digest.update(payload)
        if digest.hexdigest() != head.sha256:
            raise Rejected("its checksum does not match")
        return payload


def pack_tokens(tokens: Sequence[int]) -> array.array[int]:
    """*tokens* as int32, the array a file holds and its name hashes."""
    packed = array.array(_TOKEN, tokens)
    if packed.itemsize != 4:  # pragma: no cover - int is 32 bits on every platform llama.cpp runs on
        raise RuntimeError("int32 tokens expected")
    return packed
