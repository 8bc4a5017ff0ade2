"""JSON response bodies and the one unstructure converter for response models.

Response models are attrs classes; a field whose default is ``None`` is left
out when it is ``None``; every other field is always written (so
``"finish_reason": null`` and ``"object": "chat.completion"`` appear).  A field
with a :data:`~._converter.WIRE_NAME` is written under that key.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override
from quart import Response

from ._converter import WIRE_NAME

__all__ = ["dumps", "json_response", "unstructure"]


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter()

    def unstructure_fn(cls: type) -> Any:
        overrides = {
            field.name: override(omit_if_default=field.default is None, rename=field.metadata.get(WIRE_NAME))
            for field in attrs.fields(cls)
            if field.default is None or WIRE_NAME in field.metadata
        }
        return make_dict_unstructure_fn(cls, converter, **overrides)  # type: ignore[arg-type] # cattrs types **kw loosely

    converter.register_unstructure_hook_factory(attrs.has, unstructure_fn)
    return converter


# Configured once here and never reconfigured; cattrs memoizes generated hooks inside it.
_CONVERTER = _make_converter()


def unstructure(model: Any) -> Any:
    """A response model as plain JSON-ready Python values."""
    return _CONVERTER.unstructure(model)


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def json_response(model: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response for an attrs model or plain JSON value."""
    body = dumps(unstructure(model) if attrs.has(type(model)) else model)
    return Response(body, status=status, headers=headers, content_type="application/json")
