"""What ``GET /`` answers a client that is not a browser: the sentence Ollama's clients look for.

Ollama answers ``GET``/``HEAD /`` with ``Ollama is running`` (text/plain), and
apps that speak its API probe for it.  With the chat page on, ``/`` is the page
for a browser (``Accept: text/html``) and this sentence for anything else
(:mod:`bubo.api.webui`); with the page off, :data:`blueprint` serves it.
"""

from __future__ import annotations

from quart import Blueprint, Response, request

__all__ = ["ROOT_TEXT", "blueprint", "running", "wants_html"]

ROOT_TEXT = "Ollama is running"

blueprint = Blueprint("root", __name__)


def wants_html() -> bool:
    """Whether the request prefers HTML to plain text (a browser; ``*/*`` alone is not one)."""
    return request.accept_mimetypes.best_match(["text/plain", "text/html"]) == "text/html"


def running() -> Response:
    """``Ollama is running``, as text/plain."""
    return Response(ROOT_TEXT, content_type="text/plain; charset=utf-8")


@blueprint.get("/")
async def root() -> Response:
    """``Ollama is running`` (the chat page is off)."""
    return running()
