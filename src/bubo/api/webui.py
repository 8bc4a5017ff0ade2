"""The built-in chat page: ``GET /`` and its files under ``/webui/``.

The page is static (``_webui/``, shipped inside the package): it talks to the
server only through the public API, as any other client would.  Its files are
served without the API key: they hold nothing secret (no key, no setting, no
model output), and a browser cannot send an ``Authorization`` header when it
loads a page.  The page asks for the key and sends it on every API call.

Every answer carries a Content-Security-Policy that allows scripts, styles
and connections from this origin only and no inline script, so model text that
reached the page as HTML could not run even if the sanitizer missed it.
"""

from __future__ import annotations

from importlib.resources import files
from types import MappingProxyType

from quart import Blueprint, Response

from bubo.errors import NotFound

from ._root import running, wants_html

__all__ = ["ASSETS", "SECURITY_HEADERS", "blueprint", "is_public"]

blueprint = Blueprint("webui", __name__)

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_FILES = ("index.html", "app.js", "style.css", "icon.svg", "vendor/marked.umd.js", "vendor/purify.min.js")
_ROOT = files("bubo.api").joinpath("_webui")

ASSETS: MappingProxyType[str, bytes] = MappingProxyType(
    {name: _ROOT.joinpath(name).read_bytes() for name in _FILES}
)
"""The page's files by path under ``/webui/`` (read once: about 110 KB in all)."""

SECURITY_HEADERS: MappingProxyType[str, str] = MappingProxyType(
    {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-cache",
    }
)


def is_public(blueprint_name: str | None) -> bool:
    """Whether a request routed to *blueprint_name* is served without the API key (the page's files)."""
    return blueprint_name == blueprint.name


def _asset(name: str) -> Response:
    try:
        body = ASSETS[name]
    except KeyError:
        raise NotFound(f"no such file: /webui/{name}") from None
    suffix = name[name.rindex(".") :]
    return Response(body, content_type=_TYPES[suffix], headers=dict(SECURITY_HEADERS))


@blueprint.get("/")
async def page() -> Response:
    """The chat page for a browser; ``Ollama is running`` for the apps that probe ``/`` (``_root.py``)."""
    return _asset("index.html") if wants_html() else running()


@blueprint.get("/webui/<path:name>")
async def asset(name: str) -> Response:
    """One of the page's scripts, styles or icons."""
    return _asset(name)
