"""What the router's routes reach through the app (never module globals)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import httpx
import trio
from quart import current_app

from bubo.config import ConfigError
from bubo.errors import InvalidRequest
from bubo.model import ModelCard
from bubo.service.work import Workers

from .catalog import CatalogEntry
from .registry import Registry
from .supervisor import Supervisor

__all__ = ["ROUTER_KEY", "RouterContext", "router_context"]

logger = logging.getLogger(__name__)

ROUTER_KEY = "bubo.router"


@attrs.define(kw_only=True, eq=False)
class RouterContext:
    """The router's models, their children, and its settings, built by ``create_router_app``."""

    registry: Registry
    supervisor: Supervisor
    client: httpx.AsyncClient
    created: int  # unix time the router started: ``created`` in /models
    models_max: int
    autoload: bool
    allow_extra_args: bool
    clients_unload: bool = True  # keep_alive 0 unloads a model (--ollama-keep-alive obey)
    cards: dict[str, ModelCard] = attrs.field(factory=dict)  # each model file's card (start-up, reloads)
    cards_of: Callable[[tuple[CatalogEntry, ...]], dict[str, ModelCard]] = lambda _entries: {}
    catalog: Callable[[], tuple[CatalogEntry, ...]] = tuple  # reads the catalog again (a reload)
    # request bodies parsed off the event loop (to find the model they name), a few at a time
    workers: Workers = attrs.field(factory=Workers)
    stopping: bool = False  # a shutdown signal arrived: no new requests
    draining: bool = False  # a shutdown signal arrived: /ready is 503, requests are still forwarded
    _reloading: trio.Lock = attrs.field(init=False, factory=trio.Lock)

    async def reload(self) -> None:
        """Read the catalog again; running models that changed or went are unloaded.

        The directory is scanned and each file's card read in a worker thread:
        on the event loop a large or slow directory froze every request,
        ``/health`` included.  Reloads run one at a time, each applied whole.

        Raises:
            InvalidRequest: the preset file is refused now (the models stay as they were).

        """
        async with self._reloading:
            entries, cards = await trio.to_thread.run_sync(self._read_catalog, thread_name="bubo-reload")
            for record in self.registry.reload(entries):
                logger.info("reload: unloading %s (its entry changed or is gone)", record.name)
                self.supervisor.unload(record)
            self.cards = cards

    def _read_catalog(self) -> tuple[tuple[CatalogEntry, ...], dict[str, ModelCard]]:
        """The catalog and its cards, read again (a job for a worker thread)."""
        try:
            entries = self.catalog()
        except ConfigError as error:
            raise InvalidRequest(f"the models were not reloaded: {error}", param="reload") from None
        return entries, self.cards_of(entries)


def router_context() -> RouterContext:
    """The running router app's :class:`RouterContext`."""
    context: RouterContext = current_app.extensions[ROUTER_KEY]
    return context
