"""llama-server's ``POST /slots/{id}?action=save|restore|erase`` (``--slot-save-path``)."""

from __future__ import annotations

import time

import attrs
from quart import Response, request

from bubo.api._context import json_body, require_runtime
from bubo.api._json import json_response
from bubo.errors import InvalidRequest, NotImplementedOnThisModel
from bubo.service.slot_files import restore_slot, save_slot, slot_path

from .routes import blueprint

__all__ = ["SlotErased", "SlotRestored", "SlotSaved"]


@attrs.frozen(kw_only=True)
class SaveTimings:
    save_ms: float


@attrs.frozen(kw_only=True)
class RestoreTimings:
    restore_ms: float


@attrs.frozen(kw_only=True)
class SlotSaved:
    """``action=save``'s answer."""

    id_slot: int
    filename: str
    n_saved: int  # tokens
    n_written: int  # bytes
    timings: SaveTimings


@attrs.frozen(kw_only=True)
class SlotRestored:
    """``action=restore``'s answer."""

    id_slot: int
    filename: str
    n_restored: int  # tokens
    n_read: int  # bytes
    timings: RestoreTimings


@attrs.frozen(kw_only=True)
class SlotErased:
    """``action=erase``'s answer."""

    id_slot: int
    n_erased: int  # tokens


@blueprint.post("/slots/<id_slot>")
async def slot_action(id_slot: str) -> Response:
    """Save, restore or erase one idle slot's KV cache (503 ``slot_busy`` while a request holds it).

    A save past the directory's quota is 507 ``slot_quota_exceeded``; a restore of a file another
    model, other settings or another LoRA adapter set computed, or whose bytes are not those saved,
    is a 400 naming ``filename`` (``slot_file_*``).
    """
    runtime = require_runtime()
    store = runtime.slot_files
    if store is None:
        raise NotImplementedOnThisModel(
            "this server does not support slot actions; start it with --slot-save-path DIR"
        )
    n_slots = runtime.engine.n_slots
    if not id_slot.isascii() or not id_slot.isdigit() or not 0 <= int(id_slot) < n_slots:
        raise InvalidRequest(
            f"invalid slot id {id_slot[:40]!r}: use a slot id from 0 to {n_slots - 1}", param="id_slot"
        )
    slot_id = int(id_slot)
    action = request.args.get("action")
    started = time.perf_counter()
    if action == "erase":
        n_erased = await runtime.engine.erase_slot(slot_id)
        return json_response(SlotErased(id_slot=slot_id, n_erased=n_erased))
    if action not in ("save", "restore"):
        raise InvalidRequest("action must be save, restore or erase", param="action")
    directory = store.directory
    path = await json_body(runtime, lambda body: slot_path(directory, body.get("filename")))
    if action == "save":
        saved = await save_slot(runtime, store, slot_id, path)
        elapsed = round((time.perf_counter() - started) * 1000, 3)
        return json_response(
            SlotSaved(
                id_slot=slot_id,
                filename=path.name,
                n_saved=saved.n_tokens,
                n_written=saved.n_bytes,
                timings=SaveTimings(save_ms=elapsed),
            )
        )
    restored = await restore_slot(runtime, store, slot_id, path)
    elapsed = round((time.perf_counter() - started) * 1000, 3)
    return json_response(
        SlotRestored(
            id_slot=slot_id,
            filename=path.name,
            n_restored=restored.n_tokens,
            n_read=restored.n_bytes,
            timings=RestoreTimings(restore_ms=elapsed),
        )
    )
