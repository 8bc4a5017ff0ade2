"""``bubo serve``: flags (llama-server compatible) over ``BUBO_*`` variables, then Hypercorn.

No business logic here: parse, build settings, serve.  A bad flag or value
prints one line and exits with status 2; a model that fails to load exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

import trio

from bubo._logging import configure_logging
from bubo.config import ConfigError, Settings, add_flags, flag_values, load_settings
from bubo.domain.addresses import is_loopback

__all__ = ["main", "serve_binds", "until_drain_begins", "warn_if_exposed"]

logger = logging.getLogger("bubo")

# After the drain, Hypercorn's grace: streams that just finished flush their last bytes;
# what still runs is cancelled, idle keep-alive connections are closed.
FLUSH_AFTER_DRAIN_S = 2.0


def _parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    # No abbreviations: --por would be --port, so a flag's meaning would depend on the others there are.
    parser = parser_class(prog="bubo", description="A local LLM inference server.", allow_abbrev=False)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve a GGUF model over HTTP",
        description="Serve one GGUF model. Every flag can also be set with the environment variable shown.",
        allow_abbrev=False,
    )
    add_flags(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from importlib.metadata import version  # noqa: PLC0415

        print(f"bubo {version('bubo')}")  # noqa: T201
        return 0
    if args.command != "serve":
        parser.print_help()
        return 2
    try:
        settings = load_settings(flag_values(args))
    except ConfigError as error:
        print(f"bubo: {error}", file=sys.stderr)  # noqa: T201 - the one clear line
        return 2
    configure_logging(settings.log_level)
    try:
        return trio.run(_serve, settings, flag_values(args))
    except ConfigError as error:  # found while building the app: a router's preset file
        print(f"bubo: {error}", file=sys.stderr)  # noqa: T201 - the one clear line
        return 2


def warn_if_exposed(settings: Settings) -> None:
    """Say so when the server listens beyond this machine without an API key."""
    exposed = [host for host in settings.server.hosts if not is_loopback(host)]
    if exposed and settings.server.api_key is None:
        logger.warning(
            "listening on %s without --api-key: anyone who can reach this address can use the model",
            ", ".join(exposed),
        )


def serve_binds(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """Hypercorn's binds: each ``--host`` on ``--port``, or for a router's child the socket it was handed.

    Raises:
        ConfigError: a router's child without its socket (``bubo.router.child``).

    """
    from bubo.router.child import inherited_listener  # noqa: PLC0415 - imported when serving

    listener = inherited_listener(environ)
    if listener is not None:
        return [f"fd://{listener}"]
    return [_bind(host, settings.server.port) for host in settings.server.hosts]


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def until_drain_begins(settings: Settings, start_draining: Callable[[], None]) -> None:
    """Wait for SIGINT or SIGTERM, then for ``--drain-delay`` seconds unready but still serving.

    During the delay ``/ready`` answers 503 (*start_draining*) while requests are
    admitted as before, so a gateway that polls ``/ready`` takes this server out
    of rotation before anything it sends is refused; the drain comes after.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        name = signal.Signals(await anext(signals)).name
    delay = settings.server.drain_delay
    if delay > 0:
        start_draining()
        logger.info("%s: /ready answers 503; requests are still served for %g s (--drain-delay)", name, delay)
        await trio.sleep(delay)
    logger.info(
        "%s: no new requests; running requests have %.0f s to finish", name, settings.server.shutdown_timeout
    )


async def _serve(settings: Settings, flags: dict[str, str | list[str]]) -> int:
    from hypercorn.config import Config  # noqa: PLC0415 - imported when serving, not for --help

    from bubo.router import create_router_app, inherited_flags  # noqa: PLC0415
    from bubo.router import drain as drain_router  # noqa: PLC0415
    from bubo.router import start_draining as start_draining_router  # noqa: PLC0415
    from bubo.router.child import is_router_child, router_gone  # noqa: PLC0415
    from bubo.server import create_app, drain, start_draining  # noqa: PLC0415
    from bubo.transport import ConnectionLimiter, raise_open_file_limit, serve  # noqa: PLC0415

    load_failed = trio.Event()
    if settings.router_mode:  # --models-dir without -m: each model in a child `bubo serve` (docs/router.md)
        app = create_router_app(settings, inherited=inherited_flags(flags))
        drain = drain_router
        start_draining = start_draining_router
    else:
        app = create_app(settings, on_load_failure=load_failed.set)
    config = Config()
    config.bind = serve_binds(settings, os.environ)
    config.accesslog = None  # the app writes one line per request, aborted ones too (bubo/api/_access_log.py)
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = FLUSH_AFTER_DRAIN_S
    config.keep_alive_timeout = settings.server.keep_alive_timeout
    limiter = ConnectionLimiter.below_descriptor_limit(
        settings.server.max_connections, raise_open_file_limit()
    )
    warn_if_exposed(settings)

    async def shutdown_trigger() -> None:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                await until_drain_begins(settings, lambda: start_draining(app))
                await drain(app, settings.server.shutdown_timeout)
                nursery.cancel_scope.cancel()

            async def on_load_failure() -> None:
                await load_failed.wait()
                nursery.cancel_scope.cancel()

            async def on_router_gone() -> None:
                await router_gone()
                logger.warning("the router that started this server is gone: stopping")
                await drain(app, settings.server.shutdown_timeout)
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_signal)
            nursery.start_soon(on_load_failure)
            if is_router_child():  # a model's child in router mode (docs/router.md)
                nursery.start_soon(on_router_gone)

    await serve(app, config, limiter, shutdown_trigger=shutdown_trigger)
    logger.info("stopped; the model is freed")
    return 1 if load_failed.is_set() else 0
