"""Small image files for request bodies, made with Pillow: PNG bytes, their base64 and data URI."""

from __future__ import annotations

import base64
import io

from PIL import Image

__all__ = ["CORRUPT_PNG", "b64", "data_uri", "png"]


def png(color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (8, 8)) -> bytes:
    """A PNG of one *color*."""
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


CORRUPT_PNG = png()[:40]
"""A PNG cut off inside its header: base64 that is valid, bytes that are no image."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"
