"""What the router's routes reach through the app (never module globals)."""

from __future__ import annotations

import attrs
import httpx
from quart import current_app

from bubo.model import ModelCard

from .registry import Registry
from .supervisor import Supervisor

__all__ = ["ROUTER_KEY", "RouterContext", "router_context"]

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
    cards: dict[str, ModelCard] = attrs.field(factory=dict)  # each model file's card, read at start-up
    stopping: bool = False  # a shutdown signal arrived: no new requests


def router_context() -> RouterContext:
    """The running router app's :class:`RouterContext`."""
    context: RouterContext = current_app.extensions[ROUTER_KEY]
    return context
