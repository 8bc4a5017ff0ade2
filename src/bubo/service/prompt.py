"""Chat and raw prompts to token ids: the one render-and-tokenize path.

Generation, ``/apply-template``, ``/tokenize``-free counting and Anthropic's
``count_tokens`` all call these, so their token counts agree by construction.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal

import attrs

from bubo.domain.media import DEFAULT_MEDIA_MARKER, ImageInput, PlacedImage, split_at_images
from bubo.domain.messages import ChatPrompt
from bubo.domain.requests import PromptPiece
from bubo.errors import BuboError, ContextOverflow, InvalidRequest, UnsupportedContent
from bubo.tokenizer import Tokenizer

from .runtime import Runtime

__all__ = [
    "DECODE_BYTES_PER_PIXEL",
    "BosRule",
    "RenderedPrompt",
    "count_chat",
    "image_work_bytes",
    "min_tokens",
    "raw_tokens",
    "reading_images",
    "render_chat",
    "stable_prompt",
    "tokenize_raw",
]


@attrs.frozen(kw_only=True)
class RenderedPrompt:
    """The prompt text and its token ids (BOS included when the model adds one).

    With ``images``, ``tokens`` hold each image's run (:class:`PromptImage`) where
    the text held its marker, and ``text`` still holds the markers.
    """

    text: str
    tokens: tuple[int, ...]
    images: tuple[PlacedImage, ...] = ()


BILLING_HEADER = "x-anthropic-billing-header:"
_BILLING_LINE = re.compile(r"^x-anthropic-billing-header:[^\n]*", re.MULTILINE)
STABLE_BILLING_LINE = "x-anthropic-billing-header: -"
"""What Claude Code's attribution line becomes: the same on every turn, from every client version."""


def stable_prompt(prompt: ChatPrompt) -> ChatPrompt:
    """*prompt* with volatile stamps that would defeat the prompt cache made constant.

    Claude Code starts its system prompt with an attribution line,
    ``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=<hash>;``,
    whose hash changes every turn and whose version and entry point change
    between releases and between the CLI and the SDK; a changed first line would
    make every turn a full cache miss.  The whole line means nothing to a local
    model: it becomes :data:`STABLE_BILLING_LINE`.
    """
    if not any(m.role == "system" and m.content and BILLING_HEADER in m.content for m in prompt.messages):
        return prompt
    messages = tuple(
        attrs.evolve(m, content=_BILLING_LINE.sub(STABLE_BILLING_LINE, m.content))
        if m.role == "system" and m.content
        else m
        for m in prompt.messages
    )
    return attrs.evolve(prompt, messages=messages)


DECODE_BYTES_PER_PIXEL = 24
"""Working memory per pixel while an image is decoded, converted and handed to the projector.

Measured (peak RSS over the decode of a 5000x5000 PNG): 7 bytes a pixel for an
RGB file, 11 for gray or palette, 19 for RGBA (composited over white), then 3
more for the projector's copy of the bitmap, and its resizing.
"""


def image_work_bytes(runtime: Runtime, images: Sequence[ImageInput]) -> int:
    """What reading *images* may take besides their files, reserved before any is read.

    One image is decoded at a time, at the largest allowed; each image read is
    then held until the request ends (its embeddings, the projector's input).
    """
    vision = runtime.engine.vision
    if not images or vision is None:
        return 0
    held = min(len(images), vision.max_images) * vision.encoder_bytes
    return vision.max_pixels * DECODE_BYTES_PER_PIXEL + held


def reading_images(runtime: Runtime, images: Sequence[ImageInput]) -> AbstractAsyncContextManager[None]:
    """Hold the model awake while *images* are read (the projector sleeps with it); nothing without images."""
    if not images:
        return contextlib.nullcontext()
    return runtime.engine.awake()


def render_chat(
    runtime: Runtime, prompt: ChatPrompt, *, n_ctx: int | None = None, before: int = 0
) -> RenderedPrompt:
    """Render *prompt* with the chat template and tokenize it.

    With *n_ctx*, a prompt that cannot fit is refused as soon as that is
    known: from its size before tokenizing, else once tokenizing passes it
    (and before a later image is read).  *before* tokens will go in front of
    it (Ollama's ``context``) and count against *n_ctx*.

    Raises:
        ContextOverflow: with *n_ctx*, the prompt has *n_ctx* tokens or more (``param`` ``messages``).

    """
    text = _chat_text(runtime, prompt)
    room = None if n_ctx is None else n_ctx - 1 - before  # a prompt of n_ctx tokens or more does not fit
    in_context = _context_overflow(n_ctx, "messages")

    def overflow(n_tokens: int, at_least: bool) -> BuboError:
        return in_context(n_tokens + before, at_least)

    if prompt.images:
        tokens, images = _with_images(runtime, text, prompt.images, prompt.media_marker, room, overflow)
        return RenderedPrompt(text=text, tokens=tuple(tokens), images=images)
    tokens = _text_tokens(runtime.tokenizer, text, room, 0, overflow, add_special=True)
    return RenderedPrompt(text=text, tokens=tuple(tokens))


def _with_images(
    runtime: Runtime,
    text: str,
    images: Sequence[ImageInput],
    marker: str,
    room: int | None,
    overflow: Callable[[int, bool], BuboError],
    *,
    add_special: bool = True,
    parse_special: bool = True,
) -> tuple[list[int], tuple[PlacedImage, ...]]:
    """The ids of *text* with each image's *marker* replaced by its run (read by the engine's projector).

    The text between markers is tokenized piece by piece, as llama.cpp's mtmd
    does (special tokens added to the first piece only).  Each image is read
    where its marker is (:func:`~bubo.domain.media.split_at_images`), and as
    soon as the prompt is found not to fit, no later image is read.

    Raises:
        UnsupportedContent: the model reads text only.
        InvalidRequest: more images than ``--image-max-count``, an image that is not readable, one
            the template left out or repeated, or a prompt that ends with one.
        BuboError: *overflow*'s error.

    """
    vision = runtime.engine.vision
    if vision is None:
        raise UnsupportedContent("image", param=images[0].param)
    if len(images) > vision.max_images:
        raise InvalidRequest(
            f"a request may hold at most {vision.max_images} images (the server's --image-max-count); "
            f"this one holds {len(images)}",
            param=images[vision.max_images].param,
        )
    pieces, order = split_at_images(text, marker)
    if sorted(order) != list(range(len(images))):
        raise InvalidRequest(
            f"the rendered prompt holds {len(order)} image markers for the request's {len(images)} "
            "images, not each once (the chat template left out or repeated a message with an image)",
            param=images[0].param,
        )
    tokenizer = runtime.tokenizer
    tokens: list[int] = []
    placed: list[PlacedImage] = []
    for index, piece in enumerate(pieces):
        tokens.extend(
            _text_tokens(
                tokenizer,
                piece,
                room,
                len(tokens),
                overflow,
                add_special=add_special and index == 0,
                parse_special=parse_special,
            )
        )
        if index == len(order):
            break
        source = images[order[index]]
        image = vision.read_image(source.data, param=source.param)
        placed.append(PlacedImage(at=len(tokens) + image.start, image=image))
        tokens.extend(image.tokens)
        if room is not None and len(tokens) > room:
            raise overflow(len(tokens), True)  # noqa: FBT003
    if placed and placed[-1].end == len(tokens):
        raise InvalidRequest(
            "the prompt ends with an image, whose positions give no logits: put text after it",
            param=images[order[-1]].param,
        )
    return tokens, tuple(placed)


def count_chat(runtime: Runtime, prompt: ChatPrompt) -> int:
    """How many tokens ``render_chat`` gives, without keeping them (``count_tokens``)."""
    return runtime.tokenizer.count(_chat_text(runtime, prompt), add_special=True)


def _chat_text(runtime: Runtime, prompt: ChatPrompt) -> str:
    """The rendered prompt text.

    A template that prints the BOS token itself (Gemma, Llama 3) would double it
    when the tokenizer adds BOS too: the printed one is dropped, as llama.cpp does.
    """
    text = runtime.template.render(stable_prompt(prompt))
    tokenizer = runtime.tokenizer
    if tokenizer.add_bos and tokenizer.bos_token and text.startswith(tokenizer.bos_token):
        text = text[len(tokenizer.bos_token) :]
    return text


def min_tokens(tokenizer: Tokenizer, text: str) -> int:
    """A lower bound on the tokens of *text*, from its size alone (0 when the tokenizer gives none)."""
    per_token = tokenizer.max_token_bytes
    if not per_token or not text:
        return 0
    n_bytes = len(text) if text.isascii() else len(text.encode("utf-8", errors="surrogatepass"))
    return -(-n_bytes // per_token)


BosRule = Literal["unless_present", "always", "never"]
"""Whether a raw prompt gets the model's BOS in front (when the model adds one): ``unless_present``
(generation: not when the prompt already starts with it), ``always`` (``/tokenize``, as
``llama_tokenize`` does), ``never``."""


def raw_tokens(
    tokenizer: Tokenizer,
    prompt: Sequence[PromptPiece],
    *,
    param: str,
    room: int | None,
    overflow: Callable[[int, bool], BuboError],
    bos: BosRule = "unless_present",
    parse_special: bool = True,
) -> list[int]:
    """The token ids of a raw prompt of text and/or token ids (llama-server's ``prompt`` and ``content``).

    Text is tokenized without special tokens of its own (*parse_special*: markup
    is read as special tokens); ids are kept as given.  With *room*, a prompt of
    more than *room* ids is refused as soon as that is known, before tokenizing
    text that cannot fit; ``overflow(n, at_least)`` builds that error (``at_least``:
    the prompt has *n* ids or more).

    Raises:
        InvalidRequest: a token id is outside the vocabulary (``param`` ``<param>[<index>]``).
        BuboError: ``overflow``'s error.

    """
    bos_ids = (
        [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None and bos != "never" else []
    )
    reserved = int(bool(bos_ids) and (bos == "always" or tuple(prompt[:1]) != tuple(bos_ids)))
    tokens: list[int] = []
    for index, piece in enumerate(prompt):
        if isinstance(piece, str):
            before = reserved + len(tokens)
            tokens.extend(_text_tokens(tokenizer, piece, room, before, overflow, parse_special=parse_special))
        elif 0 <= piece < tokenizer.n_vocab:
            tokens.append(piece)
        else:
            raise InvalidRequest(
                f"token id {piece} is outside the vocabulary (0..{tokenizer.n_vocab - 1})",
                param=f"{param}[{index}]",
            )
    if bos_ids and (bos == "always" or tokens[:1] != bos_ids):
        tokens[:0] = bos_ids
    if room is not None and len(tokens) > room:
        raise overflow(len(tokens), False)  # noqa: FBT003
    return tokens


def _text_tokens(
    tokenizer: Tokenizer,
    text: str,
    room: int | None,
    before: int,
    overflow: Callable[[int, bool], BuboError],
    *,
    parse_special: bool = True,
    add_special: bool = False,
) -> list[int]:
    """The ids of *text*, or *overflow*'s error as soon as *before* + its ids cannot be at most *room*."""
    if room is None:
        return tokenizer.encode(text, add_special=add_special, parse_special=parse_special)
    left = room - before
    at_least = min_tokens(tokenizer, text)
    if at_least > left:
        raise overflow(before + at_least, True)  # noqa: FBT003
    tokens = tokenizer.encode(text, add_special=add_special, parse_special=parse_special, limit=max(left, 0))
    if len(tokens) > left:
        raise overflow(before + len(tokens), True)  # noqa: FBT003
    return tokens


def tokenize_raw(
    runtime: Runtime,
    prompt: tuple[PromptPiece, ...],
    *,
    param: str = "prompt",
    n_ctx: int | None = None,
    images: Sequence[ImageInput] = (),
    media_marker: str = DEFAULT_MEDIA_MARKER,
) -> RenderedPrompt:
    """A raw prompt for generation: its ids (:func:`raw_tokens`, BOS in front as llama-server adds) and text.

    With *images* (llama-server's ``multimodal_data``) the prompt is text, and
    each *media_marker* in it is the next image.

    Raises:
        InvalidRequest: a token id is outside the vocabulary; token ids beside images; an unreadable image.
        UnsupportedContent: images for a model that reads text only.
        ContextOverflow: with *n_ctx*, the prompt has *n_ctx* tokens or more.

    """
    tokenizer = runtime.tokenizer
    room = None if n_ctx is None else n_ctx - 1  # a prompt of n_ctx tokens or more does not fit
    if images:
        return _raw_with_images(runtime, prompt, param, room, n_ctx, images, media_marker)
    tokens = raw_tokens(tokenizer, prompt, param=param, room=room, overflow=_context_overflow(n_ctx, param))
    text = "".join(p if isinstance(p, str) else tokenizer.decode([p]) for p in prompt)
    return RenderedPrompt(text=text, tokens=tuple(tokens))


def _raw_with_images(
    runtime: Runtime,
    prompt: tuple[PromptPiece, ...],
    param: str,
    room: int | None,
    n_ctx: int | None,
    images: Sequence[ImageInput],
    media_marker: str,
) -> RenderedPrompt:
    """:func:`tokenize_raw` for a text prompt with images: the model's BOS in front unless it is there."""
    texts = [piece for piece in prompt if isinstance(piece, str)]
    if len(texts) != len(prompt):
        raise InvalidRequest("a prompt with multimodal_data must be text, not token ids", param=param)
    text = "".join(texts)
    tokenizer = runtime.tokenizer
    bos = tokenizer.bos_id if tokenizer.add_bos else None
    tokens, placed = _with_images(
        runtime, text, images, media_marker, room, _context_overflow(n_ctx, param), add_special=False
    )
    if bos is not None and tokens[:1] != [bos]:
        tokens.insert(0, bos)
        placed = tuple(attrs.evolve(image, at=image.at + 1) for image in placed)
        if room is not None and len(tokens) > room:
            raise _context_overflow(n_ctx, param)(len(tokens), False)  # noqa: FBT003
    return RenderedPrompt(text=text, tokens=tuple(tokens), images=placed)


def _context_overflow(n_ctx: int | None, param: str) -> Callable[[int, bool], BuboError]:
    def overflow(n_tokens: int, at_least: bool) -> BuboError:
        return ContextOverflow(n_prompt_tokens=n_tokens, n_ctx=n_ctx or 0, param=param, at_least=at_least)

    return overflow
