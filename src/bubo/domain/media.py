"""Images a request sends, and what they become in a prompt."""

from __future__ import annotations

import secrets

import attrs

__all__ = [
    "DEFAULT_MEDIA_MARKER",
    "ImageInput",
    "PlacedImage",
    "PromptImage",
    "image_marker",
    "new_media_marker",
    "split_at_images",
    "stand_in_ids",
    "without_markers",
]

DEFAULT_MEDIA_MARKER = "<__media__>"
"""Where an image goes in a raw prompt (llama-server's ``multimodal_data``, llama.cpp's default marker)."""


def new_media_marker() -> str:
    """A marker for one chat request's images that no text in the request can forge.

    A translation writes image *i* as :func:`image_marker` of it where the
    image stands; the prompt is split there once the chat template rendered it
    (:func:`split_at_images`).  Typed text holding ``<__media__>`` therefore
    stays text, and a template that moves or repeats a message cannot move an
    image to another's place unnoticed.
    """
    return f"<__media_{secrets.token_hex(8)}"


def image_marker(marker: str, index: int) -> str:
    """What stands for image *index* of a request whose marker is *marker* (:func:`new_media_marker`)."""
    return f"{marker}_{index}__>"


_MARKER_END = "__>"
_MAX_INDEX_DIGITS = 6


def split_at_images(text: str, marker: str) -> tuple[list[str], list[int]]:
    """The text between the images' markers, and the image each marker stands for, in the text's order.

    A chat request's *marker* (:func:`new_media_marker`) numbers its images; an
    occurrence that is not ``marker_<i>__>`` stays text.  llama.cpp's
    :data:`DEFAULT_MEDIA_MARKER` does not, and its images come in order (a raw
    prompt's).  One pass over *text*.
    """
    if marker == DEFAULT_MEDIA_MARKER:
        parts = text.split(marker)
        return parts, list(range(len(parts) - 1))
    pieces: list[str] = []
    order: list[int] = []
    start = search = 0
    while (at := text.find(marker, search)) >= 0:
        digits = at + len(marker) + 1
        end = text.find(_MARKER_END, digits, digits + _MAX_INDEX_DIGITS + len(_MARKER_END))
        number = text[digits:end] if end > digits and text[digits - 1] == "_" else ""
        if not (number.isascii() and number.isdigit()):
            search = at + len(marker)
            continue
        pieces.append(text[start:at])
        order.append(int(number))
        start = search = end + len(_MARKER_END)
    pieces.append(text[start:])
    return pieces, order


def without_markers(text: str, marker: str, replacement: str) -> str:
    """*text* with each image's marker replaced by *replacement*."""
    pieces, _ = split_at_images(text, marker)
    return replacement.join(pieces)


_WORD = 0x7FFFFFFF  # stand-ins are -1 .. -2**31: llama.cpp's token ids are 32 bits


def stand_in_ids(digest: bytes, n_positions: int) -> tuple[int, ...]:
    """The ids standing for an image's *n_positions* embedding positions in a prompt, from its *digest*.

    Negative, so they are never a token of the vocabulary; drawn from the
    image's digest (31 bits a position, the whole digest over its first
    eight), so the prompt cache's prefix matching treats the same image as the
    same tokens and any other image as different ones from its first position.
    """
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, len(digest) - 3, 4)] or [0]
    return tuple(-1 - ((words[i % len(words)] + i // len(words)) % _WORD) for i in range(n_positions))


@attrs.frozen(kw_only=True)
class ImageInput:
    """An image a request sends: the bytes of its file (PNG, JPEG, …); ``param`` names it in errors."""

    data: bytes = attrs.field(repr=lambda data: f"<{len(data)} bytes>")
    param: str


@attrs.frozen(kw_only=True, eq=False)
class PromptImage:
    """An image as a prompt reads it, from the engine's projector.

    ``tokens`` is its whole run in the prompt: the text tokens the projector
    puts around it (``<start_of_image>`` …) and, from ``start``, one stand-in id
    per embedding position (``n_positions`` of them).  Stand-in ids are
    negative, so no vocabulary token equals one, and derived from the image's
    pixels (``digest``), so the prompt cache matches a second turn over the
    same image like any other prefix and never matches another image.
    ``handle`` is the engine's own (the encoded-image input it evaluates).
    """

    tokens: tuple[int, ...]
    start: int
    n_positions: int
    digest: str
    handle: object = attrs.field(repr=False)


@attrs.frozen(kw_only=True, eq=False)
class PlacedImage:
    """A :class:`PromptImage` whose embedding positions start at prompt index ``at``."""

    at: int
    image: PromptImage

    @property
    def end(self) -> int:
        """The prompt index after its last embedding position."""
        return self.at + self.image.n_positions
