"""Chat and raw prompts to token ids: the one render-and-tokenize path.

Generation, ``/apply-template``, ``/tokenize``-free counting and Anthropic's
``count_tokens`` all call these, so their token counts agree by construction.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

import attrs

from bubo.domain.messages import ChatPrompt
from bubo.domain.requests import PromptPiece
from bubo.errors import BuboError, ContextOverflow, InvalidRequest
from bubo.tokenizer import Tokenizer

from .runtime import Runtime

__all__ = [
    "BosRule",
    "RenderedPrompt",
    "count_chat",
    "min_tokens",
    "raw_tokens",
    "render_chat",
    "stable_prompt",
    "tokenize_raw",
]


@attrs.frozen(kw_only=True)
class RenderedPrompt:
    """The prompt text and its token ids (BOS included when the model adds one)."""

    text: str
    tokens: tuple[int, ...]


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


def render_chat(runtime: Runtime, prompt: ChatPrompt, *, n_ctx: int | None = None) -> RenderedPrompt:
    """Render *prompt* with the chat template and tokenize it.

    With *n_ctx*, a prompt that cannot fit is refused as soon as that is
    known: from its size before tokenizing, else once tokenizing passes it.

    Raises:
        ContextOverflow: with *n_ctx*, the prompt has *n_ctx* tokens or more (``param`` ``messages``).

    """
    text = _chat_text(runtime, prompt)
    room = None if n_ctx is None else n_ctx - 1  # a prompt of n_ctx tokens or more does not fit
    tokens = _text_tokens(
        runtime.tokenizer, text, room, 0, _context_overflow(n_ctx, "messages"), add_special=True
    )
    return RenderedPrompt(text=text, tokens=tuple(tokens))


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
    runtime: Runtime, prompt: tuple[PromptPiece, ...], *, param: str = "prompt", n_ctx: int | None = None
) -> RenderedPrompt:
    """A raw prompt for generation: its ids (:func:`raw_tokens`, BOS in front as llama-server adds) and text.

    Raises:
        InvalidRequest: a token id is outside the vocabulary.
        ContextOverflow: with *n_ctx*, the prompt has *n_ctx* tokens or more.

    """
    tokenizer = runtime.tokenizer
    room = None if n_ctx is None else n_ctx - 1  # a prompt of n_ctx tokens or more does not fit
    tokens = raw_tokens(tokenizer, prompt, param=param, room=room, overflow=_context_overflow(n_ctx, param))
    text = "".join(p if isinstance(p, str) else tokenizer.decode([p]) for p in prompt)
    return RenderedPrompt(text=text, tokens=tuple(tokens))


def _context_overflow(n_ctx: int | None, param: str) -> Callable[[int, bool], BuboError]:
    def overflow(n_tokens: int, at_least: bool) -> BuboError:
        return ContextOverflow(n_prompt_tokens=n_tokens, n_ctx=n_ctx or 0, param=param, at_least=at_least)

    return overflow
