"""Slot files (``--slot-save-path``): a slot's KV state saved under a plain name, restored by the same model.

The engine writes and reads llama.cpp's state file; what makes it safe to keep
is :mod:`.slot_store`'s: a temporary name renamed into place, a record of the
model's fingerprint, the LoRA adapter set and the file's checksum, and the
directory's quota.  A restore is refused (400) unless the record says the same
model under the same settings computed the cells, under the adapter set in
force now, and the bytes are those that were saved.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import trio

from bubo.engine import EngineFailure, LoraControl, SlotFile
from bubo.engine.lora import AdapterSet, adapter_set
from bubo.errors import InvalidRequest

from .runtime import Runtime
from .slot_store import RECORD_SUFFIX, SlotFileStore, SlotRecord

__all__ = ["restore_slot", "save_slot", "slot_path"]

MAX_NAME_BYTES = 255
CLEANUP_TIMEOUT_S = 30.0
"""How long removing a temporary file or a restore's private link may take once its client left."""
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


async def save_slot(runtime: Runtime, store: SlotFileStore, slot_id: int, path: Path) -> SlotFile:
    """Save the slot as *path*'s name in *store*, with its record (507 past the quota).

    This server's saves take turns (the quota is checked with each one's real size).
    Once the engine has begun writing, a client that leaves does not interrupt the rest:
    the state, its checksum and its record, or nothing.  The engine bounds its own wait
    (a file call that hangs loses it); this shield adds none.
    """
    name = path.name
    async with store.save_lock:
        await trio.to_thread.run_sync(store.open)
        await trio.to_thread.run_sync(store.check_room, name)  # full already: refused before any write
        written = store.temporary()
        with trio.CancelScope(shield=True):
            try:
                saved = await runtime.engine.save_slot(slot_id, written)
                info = runtime.engine.info
                commit = functools.partial(
                    store.commit,
                    name,
                    written,
                    fingerprint=store.fingerprint,
                    model=info.description,
                    adapters=saved.adapters,
                    n_tokens=saved.n_tokens,
                )
                await trio.to_thread.run_sync(commit)
            finally:
                await trio.to_thread.run_sync(functools.partial(written.unlink, missing_ok=True))
    return saved


async def restore_slot(
    runtime: Runtime, store: SlotFileStore, slot_id: int, path: Path, *, param: str = "filename"
) -> SlotFile:
    """Restore the slot from *path*'s name in *store*, if its record and its bytes allow (400 otherwise)."""
    name = path.name
    record = await trio.to_thread.run_sync(functools.partial(store.read_record, name, param=param))
    info = runtime.engine.info
    if record.fingerprint != store.fingerprint:
        raise InvalidRequest(
            f"{name!r} holds the state of another model or other KV settings (saved by {record.model}, "
            f"fingerprint {record.fingerprint[:12]}); this server runs {info.description} "
            f"(fingerprint {store.fingerprint[:12]})",
            code="slot_file_model_mismatch",
            param=param,
        )
    link = await trio.to_thread.run_sync(functools.partial(store.pin, name, param=param))
    try:
        await trio.to_thread.run_sync(functools.partial(store.verify, link, record, name=name, param=param))
        _check_adapters(runtime.engine, record, name, param)
        try:
            restored = await runtime.engine.restore_slot(slot_id, link)
        except EngineFailure as failure:
            if failure.fatal:
                raise
            raise InvalidRequest(
                f"{name!r} could not be restored: {failure.message}", code="slot_file_invalid", param=param
            ) from None
    finally:
        with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
            await trio.to_thread.run_sync(store.unpin, link)
    if restored.adapters != record.adapters:  # the global scales changed while it was restored
        await runtime.engine.erase_slot(slot_id)
        raise _adapter_mismatch(name, record.adapters, restored.adapters, param)
    return restored


def _check_adapters(lora: LoraControl, record: SlotRecord, name: str, param: str) -> None:
    """Refuse a file whose cells were computed under another LoRA adapter set than the one in force."""
    current = adapter_set([adapter.scale for adapter in lora.lora_adapters])
    if record.adapters != current:
        raise _adapter_mismatch(name, record.adapters, current, param)


def _adapter_mismatch(name: str, saved: AdapterSet, current: AdapterSet, param: str) -> InvalidRequest:
    def described(adapters: AdapterSet) -> str:
        return ", ".join(f"adapter {i} at {scale:g}" for i, scale in adapters) or "no LoRA adapter"

    return InvalidRequest(
        f"{name!r} was computed under {described(saved)}; the adapters in force now are {described(current)} "
        "(set them with POST /lora-adapters, or save the slot again)",
        code="slot_file_adapter_mismatch",
        param=param,
    )
