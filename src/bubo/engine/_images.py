"""Image bytes from a request, decoded to the RGB bitmap a projector reads, or refused with a 400.

A request's image is hostile until decoded: it may be no image, a truncated
or corrupt one, or a tiny file whose header promises billions of pixels (a
decompression bomb).  :func:`decode_image` reads it with Pillow and lets
nothing through but an RGB bitmap or an :class:`~bubo.errors.InvalidRequest`
naming the request field it came from:

- only PNG, JPEG, WebP, GIF and BMP are opened (Pillow is asked for those
  formats alone, so none of its other, less travelled decoders ever sees
  request bytes);
- the pixel count is checked from the header, before a single pixel is
  decoded, against the caller's ``max_pixels`` (per call: Pillow's own
  process-wide ``MAX_IMAGE_PIXELS`` is neither read nor changed; its check
  still runs inside ``Image.open`` and its refusal, above twice its limit,
  is the same 400);
- an animated image gives its first frame; EXIF orientation is applied (a
  phone's portrait photo stays upright);
- every mode becomes RGB: transparency is composited over white (what a chat
  page shows behind a transparent image), 16-bit grayscale is scaled to
  8 bits, palettes and CMYK are converted.

Pure and blocking: callers run it in a worker thread, never on the event loop.
"""

from __future__ import annotations

import hashlib
import io
import struct

import attrs
from PIL import Image, ImageOps, UnidentifiedImageError

from bubo.errors import InvalidRequest

__all__ = ["FORMATS", "Bitmap", "decode_image"]

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
"""The formats Pillow may use for request bytes (Pillow's format names)."""

# What Pillow raises for bytes it cannot decode, from its identification to the
# last pixel: its documented errors (UnidentifiedImageError is an OSError; a
# truncated file is an OSError), the bomb check's error and warning (the
# warning is raised where warnings are errors), and what its pure-Python header
# and EXIF parsers let out on malformed input.
_DECODE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    IndexError,
    KeyError,
    TypeError,
    ZeroDivisionError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)
_WHITE = (255, 255, 255, 255)
_WIDE_GRAY = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})  # 16-bit PNG grayscale opens as these
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})


@attrs.frozen
class Bitmap:
    """A decoded image: 8-bit RGB, row-major, ``3 * width * height`` bytes."""

    width: int
    height: int
    rgb: bytes = attrs.field(repr=False)

    def digest(self) -> bytes:
        """SHA-256 of the size and the pixels: equal for equal images whatever file they came in."""
        hasher = hashlib.sha256(struct.pack("<II", self.width, self.height))
        hasher.update(self.rgb)
        return hasher.digest()


def decode_image(data: bytes, *, param: str, max_pixels: int) -> Bitmap:
    """The image in *data* as an RGB bitmap (its first frame, upright).

    *param* is the request field the bytes came from (the 400's ``param``);
    *max_pixels* bounds ``width * height``, checked before decoding.

    Raises:
        InvalidRequest: *data* is not an image in one of :data:`FORMATS`, is
            corrupt or truncated, or has more than *max_pixels* pixels.

    """
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size
            if width <= 0 or height <= 0:
                raise InvalidRequest("the image has no pixels", param=param)
            if width * height > max_pixels:
                raise InvalidRequest(
                    f"the image is {width}x{height} pixels, more than the {max_pixels} this server decodes",
                    param=param,
                )
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # no copy: the decoded pixels are the largest part
            return _to_bitmap(image)
    except UnidentifiedImageError as exc:
        raise InvalidRequest(
            f"the data is not an image this server reads ({', '.join(FORMATS)})", param=param
        ) from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InvalidRequest("the image has too many pixels to decode", param=param) from exc
    except _DECODE_ERRORS as exc:
        raise InvalidRequest(f"the image is corrupt or truncated: {exc}", param=param) from exc


def _to_bitmap(image: Image.Image) -> Bitmap:
    """*image* (loaded here) as 8-bit RGB: alpha over white, 16-bit gray scaled down."""
    if image.mode in _WIDE_GRAY:
        image = image.convert("I").point(lambda value: value * (1 / 257)).convert("L")
    if image.mode in _ALPHA_MODES or (image.mode in {"P", "L", "RGB"} and "transparency" in image.info):
        over = Image.new("RGBA", image.size, _WHITE)
        image = Image.alpha_composite(over, image.convert("RGBA"))
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return Bitmap(rgb.width, rgb.height, rgb.tobytes())
