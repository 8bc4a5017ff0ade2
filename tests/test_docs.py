"""The docs stay true: every setting and every route is documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from quart_trio import QuartTrio

from bubo.config import OPTIONS, options_table

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("row", options_table(), ids=[o.env for o in OPTIONS])
def test_every_setting_is_documented(row: str) -> None:
    """docs/configuration.md has one table row per option, with its flags, variable and help.

    ``nox -s docs`` rewrites the table from the options.
    """
    assert row in (DOCS / "configuration.md").read_text().splitlines()


async def test_every_route_is_documented(app) -> None:
    """Each served path appears in the API docs."""
    quart_app: QuartTrio = app.app
    text = "".join(p.read_text() for p in DOCS.glob("*.md"))
    for rule in quart_app.url_map.iter_rules():
        path = rule.rule.split("<")[0].rstrip("/") or "/"
        if rule.endpoint == "static":
            continue
        assert f"`{path}" in text, path
