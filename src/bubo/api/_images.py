"""Images in request bodies, as every dialect sends them: data URIs and base64 strings.

A model that takes images (``--mmproj``) reads each where the translation
writes the request's media marker; a text model reads a placeholder
(:class:`~bubo.api._omitted.Omissions`), or refuses the newest user turn's.

**A request's content never makes the server fetch.**  For a model that takes
images, an image given by URL (``http://``, ``https://``, ``file://`` or anything
else but ``data:``) is a 400 naming its field: Bubo reads only the bytes a
request holds.  (A text model reads no image, so it keeps its placeholder.)
Bytes are only unwrapped here (base64, in the translation's worker thread); the
engine decodes the pixels, bounded, when the prompt is tokenized.
"""

from __future__ import annotations

import binascii

import attrs

from bubo.domain.media import (
    DEFAULT_MEDIA_MARKER,
    ImageInput,
    image_marker,
    new_media_marker,
    without_markers,
)
from bubo.domain.messages import ChatPrompt, Message
from bubo.errors import InvalidRequest, UnsupportedContent

from ._omitted import Omissions

__all__ = ["ImageCollector", "image_bytes", "marked", "refuse_url", "shown_without_images"]

_DATA_PREFIX = "data:"


def refuse_url(url: str, param: str) -> InvalidRequest:
    """The 400 for an image given by *url* instead of by its bytes."""
    shown = url if len(url) <= 64 else url[:61] + "..."
    return InvalidRequest(
        f"images must be sent as data (a data: URI or base64), not by URL ({shown!r}): "
        "this server never fetches what a request names",
        code="image_url_not_supported",
        param=param,
    )


def image_bytes(value: str, param: str, *, data_uri: bool) -> bytes:
    """The bytes of an image given as a ``data:`` URI (*data_uri*) or as bare base64.

    Raises:
        InvalidRequest: a URL (never fetched), a data URI that is not base64, or bad base64.

    """
    text = value
    if data_uri:
        if value[: len(_DATA_PREFIX)].lower() != _DATA_PREFIX:
            raise refuse_url(value, param)
        header, comma, text = value.partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise InvalidRequest("an image data URI must be base64 (data:image/png;base64,...)", param=param)
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        pass
    # clients wrap long base64 in lines; whitespace is the one leniency
    try:
        return binascii.a2b_base64("".join(text.split()), strict_mode=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidRequest(f"the image is not valid base64: {error}", param=param) from None


class ImageCollector:
    """One request's images, in the order its translation meets them.

    *takes_images*: the model reads images, so each becomes the request's marker
    and its bytes are kept; else each is a placeholder counted in *omissions*,
    or, with ``refuse``, a 400 (the newest user turn's).
    """

    def __init__(self, omissions: Omissions, *, takes_images: bool) -> None:
        self._omissions = omissions
        self.takes_images = takes_images
        self.marker = new_media_marker() if takes_images else ""
        self._images: list[ImageInput] = []

    @property
    def images(self) -> tuple[ImageInput, ...]:
        """The images collected so far."""
        return tuple(self._images)

    def data_uri(self, url: str, param: str, *, field: str = "", refuse: bool = False) -> str:
        """The text standing for an image given as a URL (``image_url``): only a ``data:`` URI is read.

        *param* names the part (a text model's refusal), *param* + *field* its URL (a bad one).
        """
        return self._image(url, param, field, data_uri=True, refuse=refuse)

    def base64(self, data: str, param: str, *, field: str = "", refuse: bool = False) -> str:
        """The text standing for an image given as bare base64 (Anthropic, Ollama)."""
        return self._image(data, param, field, data_uri=False, refuse=refuse)

    def _image(self, value: str, param: str, field: str, *, data_uri: bool, refuse: bool) -> str:
        if not self.takes_images:
            if refuse:
                raise UnsupportedContent("image", param=param)
            return self._omissions.placeholder("image")
        path = param + field
        self._images.append(ImageInput(data=image_bytes(value, path, data_uri=data_uri), param=path))
        return image_marker(self.marker, len(self._images) - 1)


def marked(messages: tuple[Message, ...], marker: str, replacement: str) -> tuple[Message, ...]:
    """*messages* with each image's *marker* in their text replaced by *replacement* (the rest as it is)."""
    if not marker:
        return messages
    return tuple(
        attrs.evolve(m, content=without_markers(m.content, marker, replacement))
        if m.content is not None and marker in m.content
        else m
        for m in messages
    )


def shown_without_images(prompt: ChatPrompt) -> ChatPrompt:
    """*prompt* to show, not to run: each image as llama.cpp's marker (``<__media__>``), none read.

    ``/apply-template`` and ``/debug/prompt`` render the prompt's text; reading
    an image needs the model awake and the projector's CPU time, and its
    tokens would show as stand-ins.  The text shows where each image goes, as
    llama-server's ``/apply-template`` does.
    """
    if not prompt.images:
        return prompt
    return attrs.evolve(
        prompt,
        messages=marked(prompt.messages, prompt.media_marker, DEFAULT_MEDIA_MARKER),
        images=(),
        media_marker="",
    )
