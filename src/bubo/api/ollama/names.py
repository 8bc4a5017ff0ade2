"""Ollama's model names (``model:tag``) over Bubo's served names.

Ollama lists a model as ``NAME:latest`` and resolves ``NAME`` to it; clients
write names in any case.  So a served name is listed with ``:latest`` (unless it
has a tag of its own), and a request's name resolves to the served name it
equals, ignoring case and a ``:latest`` tag.  Anything else is not found
(404 ``model 'x' not found``, Ollama's message), unless the server was started
with ``--model-names any``: then every name is the served model, as in the
other dialects.
"""

from __future__ import annotations

from collections.abc import Iterable

from bubo.errors import InvalidRequest, NotFound

__all__ = ["DEFAULT_TAG", "listed_name", "require_name", "resolve"]

DEFAULT_TAG = ":latest"


def listed_name(name: str) -> str:
    """How Ollama lists a served *name*: ``NAME:latest``, or the name itself when it has a tag."""
    return name if ":" in name else name + DEFAULT_TAG


def _untagged(name: str) -> str:
    return name[: -len(DEFAULT_TAG)] if name.casefold().endswith(DEFAULT_TAG) else name


def resolve(requested: str, served: Iterable[str]) -> str | None:
    """The served name *requested* means, or ``None``: exact, then ignoring case, then without ``:latest``."""
    names = tuple(served)
    for candidate in (requested, _untagged(requested)):
        if candidate in names:
            return candidate
        folded = candidate.casefold()
        for name in names:
            if name.casefold() == folded:
                return name
    return None


def require_name(requested: str | None, served: Iterable[str], *, any_name: bool = False) -> str:
    """The served name for a request's ``model``: with *any_name*, an unknown one means the first served name.

    Raises:
        InvalidRequest: no model (``missing_model``, Ollama's ``model is required``).
        NotFound: no served model of that name (``model_not_found``).

    """
    if not requested:
        raise InvalidRequest("model is required", code="missing_model", param="model")
    names = tuple(served)
    name = resolve(requested, names)
    if name is None and any_name:
        return names[0]
    if name is None:
        raise NotFound(f"model '{requested}' not found", code="model_not_found", param="model")
    return name
