"""Console logging for both entry points (``bubo serve`` and ``hypercorn bubo.app:app``)."""

from __future__ import annotations

import logging

__all__ = ["configure_logging"]


def configure_logging(level: str) -> None:
    """Send Bubo's log records to stderr at *level*, unless the host app already configured logging."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("bubo").setLevel(level.upper())
    logging.getLogger("hypercorn").setLevel(level.upper())
