"""Ollama's API in router mode: the router lists, "pulls" and unloads; everything else is forwarded.

``/api/tags`` lists every model of the directory and ``/api/ps`` the loaded ones,
from the cards read once at start-up (a file that is no readable GGUF is left
out, with a warning).  ``/api/pull`` of a model of the directory succeeds
without loading it.  An empty ``/api/chat`` or ``/api/generate`` with
``keep_alive: 0`` unloads the model (its child finishes what it runs first),
unless ``--ollama-keep-alive`` is ``extend`` or ``ignore``: then it goes to the
child like any other request, which applies the same policy (it inherits the flag).
Every other ``/api/*`` request goes to the model's child, found by Ollama's name
rules (``NAME``, ``NAME:latest``, any case), and loaded first when needed
(``/api/show`` included: its answer is the child's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from quart import Blueprint, Response

from bubo.api import ollama
from bubo.api._json import json_response
from bubo.errors import InvalidRequest
from bubo.model import GGUFError, ModelCard, read_model_card

from .catalog import CatalogEntry
from .context import RouterContext, router_context
from .registry import ModelRecord, ModelState

__all__ = ["OWN_PATHS", "blueprint", "pull", "read_cards", "record_named", "unload"]

logger = logging.getLogger(__name__)

OWN_PATHS = frozenset({"/api/version", "/api/tags", "/api/ps", "/api/pull", "/api/chat", "/api/generate"})
"""The Ollama paths the router answers itself (``/api/chat`` and ``/api/generate`` unless forwarded)."""

blueprint = Blueprint("router_ollama", __name__)


def read_cards(entries: tuple[CatalogEntry, ...]) -> dict[str, ModelCard]:
    """Each model's card, read once (at start-up); a file that cannot be read is left out."""
    cards = {}
    for entry in entries:
        try:
            cards[entry.name] = read_model_card(entry.path)
        except (GGUFError, OSError) as error:
            logger.warning("%s is left out of /api/tags: %s", entry.path, error)
    return cards


def record_named(router: RouterContext, body: Mapping[str, Any]) -> ModelRecord:
    """The model an Ollama request names (``model``, or ``name`` as ``/api/show`` and ``/api/pull`` allow).

    Raises:
        InvalidRequest: no model, or not a string.
        NotFound: no model of the directory has that name (``model 'x' not found``).

    """
    requested = body.get("model") or body.get("name")
    if requested is not None and not isinstance(requested, str):
        raise InvalidRequest("model must be a string", param="model")
    name = ollama.require_name(requested, router.registry.records)
    return router.registry.records[name]


def _loaded_context(record: ModelRecord) -> int | None:
    if record.state is not ModelState.LOADED or record.instance is None:
        return None
    value = record.instance.info.get("context_length")
    return value if isinstance(value, int) else None


@blueprint.get("/api/version")
async def version() -> Response:
    """The same version a single-model server reports."""
    return json_response(ollama.wire.Version(version=ollama.VERSION))


@blueprint.get("/api/tags")
async def tags() -> Response:
    """Every model of the directory as ``NAME:latest``."""
    router = router_context()
    entries = [
        ollama.models.listed(name, router.cards[name], _loaded_context(record))
        for name, record in router.registry.records.items()
        if name in router.cards
    ]
    return json_response(ollama.wire.ListResponse(models=entries))


@blueprint.get("/api/ps")
async def ps() -> Response:
    """The models whose child is loaded."""
    router = router_context()
    entries = [
        ollama.models.running(name, router.cards[name], context)
        for name, record in router.registry.records.items()
        if name in router.cards and (context := _loaded_context(record)) is not None
    ]
    return json_response(ollama.wire.ProcessResponse(models=entries))


async def pull(router: RouterContext, body: Mapping[str, Any]) -> Response:
    """A model of the directory is here already: success without loading it."""
    record = record_named(router, body)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean", param="stream")
    card = router.cards.get(record.name)
    if card is None:
        raise InvalidRequest(f"model {record.name!r} is not a readable GGUF file", param="model")
    return ollama.pull_response(ollama.pull_lines(card), stream=stream)


def unload(router: RouterContext, kind: str, body: Mapping[str, Any]) -> Response | None:
    """The answer to an empty request with ``keep_alive: 0`` (the model is unloaded); None for any other.

    None too when ``--ollama-keep-alive`` lets no client unload a model (:mod:`bubo.service.idle`).
    """
    empty = not body.get("messages") if kind == "chat" else not body.get("prompt")
    keep_alive = ollama.keep_alive_seconds(body.get("keep_alive"))
    if not empty or keep_alive != 0 or not router.clients_unload:
        return None
    record = record_named(router, body)
    if record.running:
        router.supervisor.unload(record)
    model = body.get("model") or record.name
    return ollama.unload_answer(kind, model, "unload")
