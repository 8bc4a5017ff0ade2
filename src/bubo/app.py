"""The Hypercorn entry point: ``hypercorn bubo.app:app --worker-class trio``.

Configured through ``BUBO_*`` environment variables (``BUBO_MODEL``,
``BUBO_CTX_SIZE``, …; see ``docs/configuration.md``); Hypercorn's own ``--bind``
decides the address.  Importing this module reads the settings and builds the
app; the model loads once the server starts.  A bad setting prints one line
and exits with status 2.
"""

from __future__ import annotations

import sys

from bubo._logging import configure_logging
from bubo.config import ConfigError, Settings, load_settings
from bubo.router import create_router_app
from bubo.server import create_app

__all__ = ["app"]


def _settings_or_exit() -> Settings:
    try:
        return load_settings()
    except ConfigError as error:
        print(f"bubo: {error}", file=sys.stderr)  # noqa: T201 - the one clear line
        raise SystemExit(2) from None


_settings = _settings_or_exit()
configure_logging(_settings.log_level)
# --models-dir without BUBO_MODEL: a router; its children inherit this environment (docs/router.md).
app = create_router_app(_settings) if _settings.router_mode else create_app(_settings)
