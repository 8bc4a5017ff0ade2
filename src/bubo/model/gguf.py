"""Read the key/value metadata of a GGUF file without loading its tensors.

The ``gguf`` package from llama.cpp parses every array element into its own numpy
view; on SmolLM2's 49,152-token vocabulary that took 6 s, and a 262,144-token
Gemma vocabulary takes far longer.  Bubo only needs the metadata section, so this
module reads it directly with :mod:`struct` from a memory map (~0.1 s).

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = ["GGUFError", "GGUFMetadata", "TensorInfo", "read_metadata"]

_MAGIC: Final = b"GGUF"
_HEADER_BYTES: Final = 24  # magic, version, tensor count, key/value count

# value type id -> (struct format, size in bytes); STRING (8) and ARRAY (9) are handled apart
_SCALARS: Final[dict[int, tuple[str, int]]] = {
    0: ("B", 1),  # UINT8
    1: ("b", 1),  # INT8
    2: ("H", 2),  # UINT16
    3: ("h", 2),  # INT16
    4: ("I", 4),  # UINT32
    5: ("i", 4),  # INT32
    6: ("f", 4),  # FLOAT32
    7: ("?", 1),  # BOOL
    10: ("Q", 8),  # UINT64
    11: ("q", 8),  # INT64
    12: ("d", 8),  # FLOAT64
}
_STRING: Final = 8
_ARRAY: Final = 9
_ALIGNMENT: Final = 32  # general.alignment's default
_F32: Final = 6


class GGUFError(ValueError):
    """The file is not a GGUF file Bubo can read."""


@attrs.frozen
class TensorInfo:
    """A tensor's description: ``shape`` in ggml's order (``ne[0]`` first), ggml type, data offset."""

    shape: tuple[int, ...]
    type: int
    offset: int  # from the start of the data section


class GGUFMetadata(Mapping[str, Any]):
    """The metadata key/value pairs of one GGUF file, as plain Python values.

    Arrays become tuples; strings are decoded as UTF-8 (invalid bytes replaced,
    as llama.cpp does when it prints them).  ``parameter_count`` is the number
    of weights: the elements of every tensor the file describes; ``tensors``
    describes each by name, ``data_offset`` is where their data begins and
    ``file_size`` the file's length.
    """

    def __init__(
        self,
        path: Path,
        version: int,
        values: dict[str, Any],
        parameter_count: int = 0,
        tensors: Mapping[str, TensorInfo] | None = None,
        data_offset: int = 0,
        file_size: int = 0,
        value_types: Mapping[str, int] | None = None,
    ) -> None:
        self.path = path
        self.version = version
        self._values = values
        self.parameter_count = parameter_count
        self.tensors: Mapping[str, TensorInfo] = tensors or {}
        self.data_offset = data_offset
        self.file_size = file_size
        self._types: Mapping[str, int] = value_types or {}

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"GGUFMetadata({str(self.path)!r}, {len(self)} keys)"

    def is_f32(self, key: str) -> bool:
        """Whether the value at *key* is stored as a 32-bit float (what llama.cpp's f32 accessor requires)."""
        return self._types.get(key) == _F32

    @property
    def architecture(self) -> str:
        """``general.architecture``, the key prefix of the model's own parameters."""
        return str(self._values.get("general.architecture", ""))

    def arch_value(self, name: str, default: Any = None) -> Any:
        """The architecture-specific value ``<arch>.<name>`` (e.g. ``context_length``)."""
        return self._values.get(f"{self.architecture}.{name}", default)


class _Cursor:
    """Sequential little- or big-endian reads from a buffer."""

    def __init__(self, buf: mmap.mmap, endian: str) -> None:
        self.buf = buf
        self.pos = 0
        self.endian = endian
        self._u64 = struct.Struct(endian + "Q")
        self._u32 = struct.Struct(endian + "I")

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.buf):
            msg = "GGUF metadata runs past the end of the file"
            raise GGUFError(msg)
        data = self.buf[self.pos : end]
        self.pos = end
        return data

    def u32(self) -> int:
        value: int = self._u32.unpack_from(self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = self._u64.unpack_from(self.take(8))[0]
        return value

    def string(self) -> str:
        size = self.u64()
        return self.take(size).decode("utf-8", errors="replace")

    def value(self, type_id: int) -> Any:
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            return self.array()
        try:
            fmt, size = _SCALARS[type_id]
        except KeyError:
            msg = f"unknown GGUF value type {type_id}"
            raise GGUFError(msg) from None
        return struct.unpack(self.endian + fmt, self.take(size))[0]

    def array(self) -> tuple[Any, ...]:
        type_id = self.u32()
        count = self.u64()
        if type_id == _STRING:
            return self._strings(count)
        if type_id == _ARRAY:
            return tuple(self.array() for _ in range(count))
        try:
            fmt, size = _SCALARS[type_id]
        except KeyError:
            msg = f"unknown GGUF array element type {type_id}"
            raise GGUFError(msg) from None
        data = self.take(size * count)
        return struct.unpack(f"{self.endian}{count}{fmt}", data)

    def _strings(self, count: int) -> tuple[str, ...]:
        buf, pos, unpack = self.buf, self.pos, self._u64.unpack_from
        out = []
        limit = len(buf)
        for _ in range(count):
            if pos + 8 > limit:
                msg = "GGUF string array runs past the end of the file"
                raise GGUFError(msg)
            (size,) = unpack(buf, pos)
            pos += 8
            if pos + size > limit:
                msg = "GGUF string array runs past the end of the file"
                raise GGUFError(msg)
            out.append(buf[pos : pos + size].decode("utf-8", errors="replace"))
            pos += size
        self.pos = pos
        return tuple(out)


def read_metadata(path: str | Path) -> GGUFMetadata:
    """Read every metadata key/value pair of the GGUF file at *path*.

    Raises:
        GGUFError: the file is not GGUF, or its metadata is truncated or malformed.
        OSError: the file cannot be opened.

    """
    path = Path(path)
    with path.open("rb") as file:
        try:
            buf = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            msg = f"{path} is empty, not a GGUF file"
            raise GGUFError(msg) from None
    with buf:
        if buf[:4] != _MAGIC:
            msg = f"{path} is not a GGUF file (no GGUF magic)"
            raise GGUFError(msg)
        if len(buf) < _HEADER_BYTES:
            msg = f"{path} is truncated: its GGUF header is incomplete"
            raise GGUFError(msg)
        (version,) = struct.unpack_from("<I", buf, 4)
        endian = "<"
        if version > 0xFFFF:  # a big-endian file read as little-endian
            endian = ">"
            (version,) = struct.unpack_from(">I", buf, 4)
        if version not in (2, 3):
            msg = f"{path}: GGUF version {version} is not supported (need 2 or 3)"
            raise GGUFError(msg)
        cursor = _Cursor(buf, endian)
        cursor.pos = 8
        tensor_count = cursor.u64()
        kv_count = cursor.u64()
        values: dict[str, Any] = {}
        types: dict[str, int] = {}
        for _ in range(kv_count):
            key = cursor.string()
            types[key] = cursor.u32()
            values[key] = cursor.value(types[key])
        tensors = dict(_tensor_info(cursor) for _ in range(tensor_count))
        alignment = values.get("general.alignment", _ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            alignment = _ALIGNMENT
        data_offset = -(-cursor.pos // alignment) * alignment
        file_size = len(buf)
    parameters = sum(math.prod(info.shape) for info in tensors.values())
    return GGUFMetadata(path, version, values, parameters, tensors, data_offset, file_size, types)


def _tensor_info(cursor: _Cursor) -> tuple[str, TensorInfo]:
    """Read one tensor's description: its name, shape, type and data offset."""
    name = cursor.string()
    shape = tuple(cursor.u64() for _ in range(cursor.u32()))
    (type_id,) = struct.unpack(cursor.endian + "I", cursor.take(4))
    return name, TensorInfo(shape=shape, type=type_id, offset=cursor.u64())
