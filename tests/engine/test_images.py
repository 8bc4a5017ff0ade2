"""Request image bytes decode to an RGB bitmap or a 400 naming the field, never anything else.

Every image here is built with Pillow in the test; the hostile ones are real
files cut short, bytes flipped at random, or headers that lie about their size.
"""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from bubo.engine._images import FORMATS, Bitmap, decode_image
from bubo.errors import InvalidRequest

PARAM = "messages[0].content[1].image_url.url"
LIMIT = 1_000_000


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def gradient(width: int, height: int) -> Image.Image:
    """An RGB image whose every pixel differs from its neighbours (so orientation shows)."""
    image = Image.new("RGB", (width, height))
    image.putdata(
        [
            (x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), 77)
            for y in range(height)
            for x in range(width)
        ]
    )
    return image


def refused(data: bytes, max_pixels: int = LIMIT) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode_image(data, param=PARAM, max_pixels=max_pixels)
    assert caught.value.status == 400
    assert caught.value.param == PARAM
    return caught.value


def png_claiming(width: int, height: int) -> bytes:
    """A real 1x1 PNG whose IHDR (CRC fixed) says it is *width* x *height*."""
    data = bytearray(encoded(Image.new("RGB", (1, 1), (1, 2, 3)), "PNG"))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


class TestRoundTrips:
    @pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF", "BMP"])
    def test_a_lossless_image_gives_its_exact_pixels(self, fmt) -> None:
        """PNG, lossless WebP, BMP and (a few-colour) GIF give back the pixels that were saved."""
        image = Image.new("RGB", (7, 5), (200, 10, 30))
        image.putpixel((3, 2), (0, 0, 255))
        options = {"lossless": True} if fmt == "WEBP" else {}
        bitmap = decode_image(encoded(image, fmt, **options), param=PARAM, max_pixels=LIMIT)
        assert bitmap == Bitmap(7, 5, image.tobytes())

    def test_a_jpeg_gives_its_size_and_nearly_its_colours(self) -> None:
        """JPEG is lossy: the size is exact, a flat colour comes back within a few levels."""
        bitmap = decode_image(
            encoded(Image.new("RGB", (16, 8), (120, 60, 200)), "JPEG", quality=95),
            param=PARAM,
            max_pixels=LIMIT,
        )
        assert (bitmap.width, bitmap.height, len(bitmap.rgb)) == (16, 8, 16 * 8 * 3)
        assert all(abs(got - want) <= 4 for got, want in zip(bitmap.rgb[:3], (120, 60, 200), strict=True))

    def test_an_animated_gif_gives_its_first_frame(self) -> None:
        frames = [Image.new("RGB", (4, 4), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
        out = io.BytesIO()
        frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
        bitmap = decode_image(out.getvalue(), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb == bytes((255, 0, 0)) * 16

    def test_an_animated_webp_gives_its_first_frame(self) -> None:
        frames = [Image.new("RGB", (4, 4), colour) for colour in ((0, 0, 255), (255, 255, 0))]
        out = io.BytesIO()
        frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:], duration=50, lossless=True)
        bitmap = decode_image(out.getvalue(), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb == bytes((0, 0, 255)) * 16

    def test_exif_orientation_is_applied(self) -> None:
        """An image stored sideways with EXIF orientation 6 (rotate 90° clockwise to view) comes back upright."""
        upright = gradient(6, 3)
        stored = upright.transpose(Image.Transpose.ROTATE_90)  # what a camera writes: 3 wide, 6 high
        exif = Image.Exif()
        exif[0x0112] = 6
        bitmap = decode_image(encoded(stored, "PNG", exif=exif), param=PARAM, max_pixels=LIMIT)
        assert (bitmap.width, bitmap.height) == (6, 3)
        assert bitmap.rgb == upright.tobytes()


class TestModes:
    def test_grayscale_becomes_three_equal_channels(self) -> None:
        bitmap = decode_image(encoded(Image.new("L", (2, 2), 90), "PNG"), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb == bytes((90, 90, 90)) * 4

    def test_sixteen_bit_grayscale_is_scaled_to_eight_bits(self) -> None:
        """65535 is white and 257·k is level k, not clipped to white."""
        image = Image.new("I;16", (2, 1))
        image.putpixel((0, 0), 65535)
        image.putpixel((1, 0), 257 * 100)
        bitmap = decode_image(encoded(image, "PNG"), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb == bytes((255, 255, 255, 100, 100, 100))

    def test_alpha_is_composited_over_white(self) -> None:
        """Opaque pixels keep their colour, transparent ones are white, half-transparent ones between."""
        image = Image.new("RGBA", (3, 1))
        image.putdata([(10, 20, 30, 255), (10, 20, 30, 0), (0, 0, 0, 128)])
        bitmap = decode_image(encoded(image, "PNG"), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb[:6] == bytes((10, 20, 30, 255, 255, 255))
        assert all(120 <= level <= 135 for level in bitmap.rgb[6:])

    def test_a_palette_with_a_transparent_index_shows_white_there(self) -> None:
        image = Image.new("P", (2, 1))
        image.putpalette([255, 0, 0, 0, 255, 0])
        image.putdata([0, 1])
        bitmap = decode_image(encoded(image, "PNG", transparency=1), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb == bytes((255, 0, 0, 255, 255, 255))

    def test_a_palette_image_gives_its_colours(self) -> None:
        image = Image.new("P", (2, 1))
        image.putpalette([1, 2, 3, 4, 5, 6])
        image.putdata([1, 0])
        bitmap = decode_image(encoded(image, "BMP"), param=PARAM, max_pixels=LIMIT)
        assert bitmap.rgb == bytes((4, 5, 6, 1, 2, 3))

    def test_a_cmyk_jpeg_becomes_rgb(self) -> None:
        bitmap = decode_image(
            encoded(Image.new("CMYK", (4, 4), (0, 0, 0, 0)), "JPEG"), param=PARAM, max_pixels=LIMIT
        )
        assert len(bitmap.rgb) == 4 * 4 * 3
        assert min(bitmap.rgb) >= 250  # no ink is white


class TestRefusals:
    def test_random_bytes_are_not_an_image(self) -> None:
        error = refused(bytes(range(256)) * 4)
        assert error.message == f"the data is not an image this server reads ({', '.join(FORMATS)})"

    def test_an_image_in_another_format_is_refused(self) -> None:
        """TIFF decodes in Pillow, but only the five formats ever see request bytes."""
        refused(encoded(Image.new("RGB", (2, 2)), "TIFF"))

    def test_a_truncated_png_is_refused(self) -> None:
        whole = encoded(gradient(40, 40), "PNG")
        error = refused(whole[: len(whole) // 2])
        assert error.message.startswith("the image is corrupt or truncated")

    def test_a_png_with_a_corrupt_chunk_is_refused(self) -> None:
        data = bytearray(encoded(gradient(8, 8), "PNG"))
        idat = data.index(b"IDAT")
        data[idat + 6] ^= 0xFF  # the compressed pixels, whose CRC no longer matches
        refused(bytes(data))

    def test_empty_bytes_are_refused(self) -> None:
        refused(b"")

    def test_too_many_pixels_are_refused_from_the_header_before_decoding(self, monkeypatch) -> None:
        """A 1x1 PNG whose header says 5000x5000 is refused by its header: no pixel is ever decoded."""

        def no_decoding(*_args: object) -> None:
            raise AssertionError("pixels were decoded")

        monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
        error = refused(png_claiming(5000, 5000), max_pixels=LIMIT)
        assert error.message == f"the image is 5000x5000 pixels, more than the {LIMIT} this server decodes"

    def test_a_decompression_bomb_is_refused_before_decoding(self, monkeypatch) -> None:
        """A header claiming 100000x100000 (10^10 pixels, 30 GB of RGB) is a 400 without decoding."""

        def no_decoding(*_args: object) -> None:
            raise AssertionError("pixels were decoded")

        monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
        refused(png_claiming(100_000, 100_000), max_pixels=LIMIT)

    def test_the_limit_is_the_callers_not_pillows(self) -> None:
        """The same image passes one limit and not a lower one: nothing process-wide is involved."""
        data = encoded(gradient(10, 10), "PNG")
        assert decode_image(data, param=PARAM, max_pixels=100).width == 10
        refused(data, max_pixels=99)
        assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's own default, untouched


def _samples() -> list[bytes]:
    image = gradient(9, 7)
    rgba = image.convert("RGBA")
    return [
        encoded(image, "PNG"),
        encoded(rgba, "PNG"),
        encoded(image, "JPEG"),
        encoded(image, "WEBP"),
        encoded(rgba, "WEBP", lossless=True),
        encoded(image.convert("P"), "GIF"),
        encoded(image, "BMP"),
    ]


SAMPLES = _samples()


@st.composite
def damaged_images(draw: st.DrawFn) -> bytes:
    """A valid image with some bytes overwritten, then perhaps cut short."""
    data = bytearray(draw(st.sampled_from(SAMPLES)))
    for _ in range(draw(st.integers(0, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


class TestFuzz:
    @settings(max_examples=300)
    @given(data=st.one_of(st.binary(max_size=512), damaged_images()))
    def test_any_bytes_give_a_bitmap_or_a_400(self, data) -> None:
        """Whatever the bytes, the answer is a well-formed bitmap or InvalidRequest: nothing else escapes."""
        try:
            bitmap = decode_image(data, param=PARAM, max_pixels=4096)
        except InvalidRequest as error:
            assert error.param == PARAM  # noqa: PT017 (either outcome is right; only its shape is checked)
        else:
            assert 0 < bitmap.width * bitmap.height <= 4096
            assert len(bitmap.rgb) == 3 * bitmap.width * bitmap.height
