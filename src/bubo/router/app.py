"""``create_router_app(settings)``: Bubo as a router over ``--models-dir`` (docs/router.md).

The same edge as the single-model app (request ids, the API key, the body
limit, CORS, one error envelope per dialect: ``bubo.server.install_edge``);
behind it, the router's own routes and a forwarding route for every route of
the single-model app.  The children's supervisor runs in the app's lifespan
nursery; the app's shutdown stops every child.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence

import httpx
from quart_trio import QuartTrio

from bubo.api import _root, webui
from bubo.api._context import EXTENSION_KEY, ApiContext
from bubo.config import Settings
from bubo.server import create_app, install_edge, package_version
from bubo.service.memory import MemoryGuard, SystemMemory
from bubo.service.runtime import ServerState
from bubo.service.work import Workers

from . import ollama
from .catalog import load_catalog
from .command import child_command
from .context import ROUTER_KEY, RouterContext
from .registry import Registry
from .routes import blueprint, forwarding_blueprint
from .supervisor import STOP_MARGIN_S, ChildCommand, Supervisor, SupervisorConfig

__all__ = ["create_router_app", "drain", "start_draining"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0  # to a child on loopback


def create_router_app(
    settings: Settings,
    *,
    inherited: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    command: ChildCommand = child_command,
) -> QuartTrio:
    """The router app over *settings*' ``--models-dir`` and ``--models-preset``.

    *inherited* are the flags each child repeats; *environ* is the children's environment (default:
    this process's); *command* builds a child's command line (tests inject a stand-in child).

    Raises:
        ConfigError: the preset file is refused.

    """
    assert settings.router_mode  # --models-dir or --models-preset, without -m
    entries = load_catalog(settings.router)
    logger.info(
        "router mode: %d models (%s%s): %s",
        len(entries),
        settings.router.models_dir or "no directory",
        f", presets {settings.router.models_preset}" if settings.router.models_preset else "",
        ", ".join(e.name for e in entries) or "none",
    )
    # No /static/ route: Quart's default folder would be ./static of the working directory here (the
    # name is no module's); the chat page's files are api/webui.py's.
    app = QuartTrio("bubo-router", static_folder=None)
    app.config.update(
        RESPONSE_TIMEOUT=60,  # the router's own responses; forwarded ones set None
        BODY_TIMEOUT=60,
        MAX_CONTENT_LENGTH=settings.server.max_body_mib * 1024 * 1024,
        JSON_SORT_KEYS=False,
    )
    # The edge reads the client's key from the ApiContext; its ServerState is unused here (each
    # child has its own; the router's models are in the registry).
    app.extensions[EXTENSION_KEY] = ApiContext(
        state=ServerState(), api_key=settings.server.api_key, version=package_version()
    )
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),  # a generation may take long
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        trust_env=False,  # never through an HTTP proxy: the children are on loopback
    )
    registry = Registry.of(entries)
    supervisor = Supervisor(
        registry,
        client,
        SupervisorConfig(
            inherited=tuple(inherited),
            environ=dict(os.environ if environ is None else environ),
            child_key=secrets.token_urlsafe(32),
            models_max=settings.router.models_max,
            load_timeout_s=settings.router.models_load_timeout,
            stop_grace_s=settings.server.shutdown_timeout + STOP_MARGIN_S,
            command=command,
        ),
    )
    router = RouterContext(
        registry=registry,
        supervisor=supervisor,
        client=client,
        created=int(time.time()),
        models_max=settings.router.models_max,
        autoload=settings.router.models_autoload,
        allow_extra_args=settings.router.models_allow_extra_args,
        clients_unload=settings.server.ollama_keep_alive == "obey",
        cards=ollama.read_cards(entries),
        cards_of=ollama.read_cards,
        catalog=lambda: load_catalog(settings.router),
        workers=Workers(
            max_jobs=settings.server.cpu_jobs,
            guard=_body_guard(settings),
            max_waiting=settings.server.max_queue,
        ),
    )
    app.extensions[ROUTER_KEY] = router
    app.register_blueprint(blueprint)
    app.register_blueprint(ollama.blueprint)
    # `/` is the router's own: the chat page (it talks to every model through the router), or
    # Ollama's "Ollama is running"
    app.register_blueprint(webui.blueprint if settings.server.webui else _root.blueprint)
    # Every route a model serves: those of the single-model app (built, never served).
    app.register_blueprint(forwarding_blueprint(create_app(settings).url_map.iter_rules()))
    app = install_edge(app, settings)

    @app.before_serving
    async def start_supervisor() -> None:
        await app.nursery.start(supervisor.run)
        for record in registry.records.values():  # a preset's load-on-startup
            if record.entry.load_on_startup:
                supervisor.request_load(record)

    @app.after_serving
    async def stop_children() -> None:
        router.stopping = True
        await supervisor.aclose()
        await client.aclose()

    return app


def _body_guard(settings: Settings) -> MemoryGuard | None:
    """What admits the router's body parses against memory (``--memory-guard``; the router holds no model)."""
    if not settings.server.memory_guard:
        return None
    return MemoryGuard(
        probe=SystemMemory(),
        kv_bytes_per_token=0,
        step_bytes=0,
        low_water_bytes=settings.server.memory_low_water_mib * 1024 * 1024,
    )


def start_draining(app: QuartTrio) -> None:
    """Answer ``/ready`` 503 from now on while still forwarding requests (``--drain-delay``)."""
    router: RouterContext = app.extensions[ROUTER_KEY]
    router.draining = True


async def drain(app: QuartTrio, grace_s: float) -> None:
    """Admit no new request and stop every child: each finishes its running requests within *grace_s*.

    Called on SIGINT/SIGTERM before Hypercorn stops serving.  The children
    drain as a single-model server does (their ``--shutdown-timeout`` is the
    router's), while the router goes on forwarding what they send.
    """
    router: RouterContext = app.extensions[ROUTER_KEY]
    router.stopping = True
    logger.info("stopping %d model processes (grace %.0f s)", len(router.registry.running()), grace_s)
    await router.supervisor.aclose()
