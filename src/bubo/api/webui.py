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

import json
from collections.abc import Iterable, Iterator
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import PurePosixPath
from types import MappingProxyType

from quart import Blueprint, Response

from bubo.domain.samplers import KNOBS, Knob
from bubo.errors import NotFound

from ._root import running, wants_html

__all__ = ["ASSETS", "SECURITY_HEADERS", "blueprint", "is_public", "samplers_module"]

blueprint = Blueprint("webui", __name__)

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".woff2": "font/woff2",
}
_ROOT = files("bubo.api").joinpath("_webui")


def _read(folder: Traversable, prefix: str = "") -> Iterator[tuple[str, bytes]]:
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from _read(entry, f"{prefix}{entry.name}/")
        elif PurePosixPath(entry.name).suffix in _TYPES:  # not the licence files beside the libraries
            yield f"{prefix}{entry.name}", entry.read_bytes()


_GROUPS = ("Sampling", "Penalties", "DRY", "XTC", "Mirostat")  # the settings form's order of its fieldsets
_REQUEST_FIELDS = {"Sampling": (("seed", "Seed", "int", 1), ("max_tokens", "Max tokens", "int", 1))}
"""The form's request fields that are not knobs of the sampler table, after its knobs."""


def samplers_module(knobs: Iterable[Knob]) -> bytes:
    """``samplers.js``: the settings form's fields, made from the sampler table (``domain.samplers``).

    ``SAMPLERS`` lists ``[legend, [[request field, label, "int" or "float", step], …]]``; the page's
    ``settings.js`` builds its form and its request fields from it, so a knob is never copied into JS.
    """
    groups: dict[str, list[tuple[str, str, str, float]]] = {group: [] for group in _GROUPS}
    for knob in knobs:
        groups.setdefault(knob.group, []).append((knob.name, knob.label, knob.kind.__name__, knob.step))
    listed = [
        [group, [*fields, *_REQUEST_FIELDS.get(group, ())]] for group, fields in groups.items() if fields
    ]
    header = b"// Made by the server from its sampler table (bubo/domain/samplers.py).\n"
    return header + b"export const SAMPLERS = " + json.dumps(listed, ensure_ascii=False).encode() + b";\n"


ASSETS: MappingProxyType[str, bytes] = MappingProxyType(
    dict(sorted({**dict(_read(_ROOT)), "samplers.js": samplers_module(KNOBS)}.items()))
)
"""The page's files by path under ``/webui/`` (read once; docs/webui.md gives their weight), with
the one the server makes, ``samplers.js``."""

SECURITY_HEADERS: MappingProxyType[str, str] = MappingProxyType(
    {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "font-src 'self'; connect-src 'self'; worker-src 'self'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'"
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
    return Response(body, content_type=_TYPES[PurePosixPath(name).suffix], headers=dict(SECURITY_HEADERS))


@blueprint.get("/")
async def page() -> Response:
    """The chat page for a browser; ``Ollama is running`` for the apps that probe ``/`` (``_root.py``)."""
    return _asset("index.html") if wants_html() else running()


@blueprint.get("/webui/<path:name>")
async def asset(name: str) -> Response:
    """One of the page's scripts, styles or icons."""
    return _asset(name)
