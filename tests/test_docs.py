"""The docs stay true: every setting and every route is documented."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from quart_trio import QuartTrio

from bubo.api._latency import (
    INTER_TOKEN_BUCKETS,
    QUEUE_WAIT_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
)
from bubo.config import OPTIONS, options_table
from bubo.engine._grammar import MAX_GBNF_CHARS, MAX_GBNF_NESTING
from bubo.grammar.schema import LIMITS

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


def test_every_router_route_is_documented(tmp_path: Path) -> None:
    """Router mode's own paths appear in the docs too (the forwarded ones are the app's)."""
    from bubo.config import load_settings
    from bubo.router import create_router_app

    router = create_router_app(load_settings({"router__models_dir": str(tmp_path)}, environ={}))
    text = "".join(p.read_text() for p in DOCS.glob("*.md"))
    for rule in router.url_map.iter_rules():
        path = rule.rule.split("<")[0].rstrip("/") or "/"
        if rule.endpoint != "static":
            assert f"`{path}" in text, path


def test_every_schema_limit_is_documented() -> None:
    """docs/operations.md lists each schema and grammar limit with its default."""
    text = (DOCS / "operations.md").read_text()
    section = text.split("## Schema and grammar limits", 1)[1].split("\n## ", 1)[0]
    for field in attrs.fields(type(LIMITS)):
        assert f"{getattr(LIMITS, field.name):,}" in section, field.name
    assert f"{MAX_GBNF_NESTING:,} nested groups" in section
    assert f"{MAX_GBNF_CHARS // (1024 * 1024)} MiB of text" in section


@pytest.mark.parametrize(
    ("name", "bounds"),
    [
        ("bubo:time_to_first_token_seconds", TIME_TO_FIRST_TOKEN_BUCKETS),
        ("bubo:inter_token_latency_seconds", INTER_TOKEN_BUCKETS),
        ("bubo:queue_wait_seconds", QUEUE_WAIT_BUCKETS),
        ("bubo:request_duration_seconds", REQUEST_DURATION_BUCKETS),
    ],
)
def test_every_latency_histogram_is_documented_with_its_buckets(name: str, bounds: tuple[float, ...]) -> None:
    """docs/llama-server.md lists each latency histogram with its bucket bounds as the code has them."""
    section = (DOCS / "llama-server.md").read_text().split("### Latency histograms", 1)[1]
    row = f"| `{name}` | {', '.join(f'{bound:g}' for bound in bounds)} |"
    assert row in section.splitlines()
