"""Slot files (``--slot-save-path``): a slot's KV state saved under a plain name, restored by the same model.

llama.cpp writes the state and the slot's tokens (``llama_state_seq_save_file``);
beside it, ``<name>.bubo.json`` records which model wrote it.  llama.cpp's file
says nothing of the model, and a state of another model with the same shape
would load as garbage: restore refuses a file whose record names another model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio

from bubo.engine import EngineFailure, ModelInfo, SlotFile
from bubo.errors import InvalidRequest

from .runtime import Runtime

__all__ = ["RECORD_SUFFIX", "model_identity", "restore_slot", "save_slot", "slot_path"]

RECORD_SUFFIX = ".bubo.json"
MAX_NAME_BYTES = 255
_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f]")


def slot_path(directory: Path, filename: object, *, param: str = "filename") -> Path:
    """*filename* inside *directory*: a plain file name, never a path out of it (400 otherwise)."""
    if not isinstance(filename, str) or not filename:
        raise InvalidRequest("filename is required: a file name inside --slot-save-path", param=param)
    if (
        _UNSAFE.search(filename)
        or filename in (".", "..")
        or filename.startswith(".")
        or filename != filename.strip()
        or len(filename.encode()) > MAX_NAME_BYTES
        or filename.endswith(RECORD_SUFFIX)
    ):
        raise InvalidRequest(
            f"invalid filename {filename[:80]!r}: use a plain file name (no directories, no leading dot, "
            f"at most {MAX_NAME_BYTES} bytes)",
            param=param,
        )
    path = directory / filename
    if path.resolve().parent != directory.resolve():
        raise InvalidRequest(f"invalid filename {filename[:80]!r}: it leaves the slot directory", param=param)
    return path


def model_identity(info: ModelInfo) -> dict[str, object]:
    """What identifies the model whose KV state a file holds (its shape, size and description)."""
    return {
        "architecture": info.architecture,
        "description": info.description,
        "n_params": info.n_params,
        "size_bytes": info.size_bytes,
        "n_vocab": info.n_vocab,
        "n_embd": info.n_embd,
    }


def _record(path: Path) -> Path:
    return path.with_name(path.name + RECORD_SUFFIX)


async def save_slot(runtime: Runtime, slot_id: int, path: Path) -> SlotFile:
    """Save the slot to *path*, with the record of the model beside it.

    The two are written together or the file has no record (restore then refuses
    it): the old record goes first, and a client that leaves does not interrupt
    the rest, since the engine writes the state whether or not anyone waits.
    The engine bounds its own wait (a file call that hangs loses it); this shield
    adds none.
    """
    await trio.Path(path.parent).mkdir(parents=True, exist_ok=True)
    with trio.CancelScope(shield=True):
        await trio.Path(_record(path)).unlink(missing_ok=True)
        saved = await runtime.engine.save_slot(slot_id, path)
        record = {"model": model_identity(runtime.engine.info), "n_tokens": saved.n_tokens}
        await trio.Path(_record(path)).write_text(json.dumps(record), encoding="utf-8")
    return saved


async def restore_slot(runtime: Runtime, slot_id: int, path: Path, *, param: str = "filename") -> SlotFile:
    """Restore the slot from *path*, if this model saved it (400 otherwise)."""
    if not await trio.Path(path).is_file():
        raise InvalidRequest(f"no slot file named {path.name!r} in the slot directory", param=param)
    try:
        record = json.loads(await trio.Path(_record(path)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InvalidRequest(
            f"{path.name!r} was not saved by this server (its model record is missing or unreadable)",
            code="slot_file_invalid",
            param=param,
        ) from None
    expected = model_identity(runtime.engine.info)
    if not isinstance(record, dict) or record.get("model") != expected:
        saved_by = record.get("model", {}) if isinstance(record, dict) else {}
        described = saved_by.get("description", "another model") if isinstance(saved_by, dict) else "?"
        raise InvalidRequest(
            f"{path.name!r} holds the state of another model ({described}); this server runs "
            f"{expected['description']}",
            code="slot_file_model_mismatch",
            param=param,
        )
    try:
        return await runtime.engine.restore_slot(slot_id, path)
    except EngineFailure as failure:
        if failure.fatal:
            raise
        raise InvalidRequest(
            f"{path.name!r} could not be restored: {failure.message}", code="slot_file_invalid", param=param
        ) from None
