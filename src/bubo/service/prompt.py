"""Chat and raw prompts to token ids: the one render-and-tokenize path.

Generation, ``/apply-template``, ``/tokenize``-free counting and Anthropic's
``count_tokens`` all call these, so their token counts agree by construction.
"""

from __future__ import annotations

import re

import attrs

from bubo.domain.messages import ChatPrompt
from bubo.domain.requests import PromptPiece
from bubo.errors import ContextOverflow, InvalidRequest
from bubo.tokenizer import Tokenizer

from .runtime import Runtime

__all__ = ["RenderedPrompt", "count_chat", "min_tokens", "render_chat", "stable_prompt", "tokenize_raw"]


@attrs.frozen(kw_only=True)
class RenderedPrompt:
    """The prompt text and its token ids (BOS included when the model adds one)."""

    text: str
    tokens: tuple[int, ...]


_VOLATILE_STAMP = re.compile(r"(x-anthropic-billing-header:[^\n]*?\bcch=)[^;\n]*")


def stable_prompt(prompt: ChatPrompt) -> ChatPrompt:
    """*prompt* with volatile stamps that would defeat the prompt cache made constant.

    Claude Code starts its system prompt with ``x-anthropic-billing-header: …;
    cch=<hash>;``, where the hash changes every turn; a changed first line would
    make every turn a full cache miss.  The hash means nothing to a local model.
    """
    if not any(m.role == "system" and m.content and "cch=" in m.content for m in prompt.messages):
        return prompt
    messages = tuple(
        attrs.evolve(m, content=_VOLATILE_STAMP.sub(r"\g<1>0", m.content))
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
    tokens = _fitting_tokens(runtime.tokenizer, text, n_ctx=n_ctx, param="messages", add_special=True)
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


def _fitting_tokens(
    tokenizer: Tokenizer,
    text: str,
    *,
    n_ctx: int | None,
    param: str,
    add_special: bool = False,
    before: int = 0,
) -> list[int]:
    """The ids of *text*, or the overflow error as soon as *before* + its tokens cannot be under *n_ctx*."""
    if n_ctx is None:
        return tokenizer.encode(text, add_special=add_special)
    room = n_ctx - 1 - before  # a prompt of n_ctx tokens or more does not fit
    at_least = min_tokens(tokenizer, text)
    if at_least > room:
        raise ContextOverflow(n_prompt_tokens=before + at_least, n_ctx=n_ctx, param=param, at_least=True)
    tokens = tokenizer.encode(text, add_special=add_special, limit=room)
    if len(tokens) > room:
        raise ContextOverflow(n_prompt_tokens=before + len(tokens), n_ctx=n_ctx, param=param, at_least=True)
    return tokens


def tokenize_raw(
    runtime: Runtime, prompt: tuple[PromptPiece, ...], *, param: str = "prompt", n_ctx: int | None = None
) -> RenderedPrompt:
    """Tokenize a raw prompt of text and/or token ids (llama-server's ``prompt``).

    The model's BOS is added in front, as llama-server does.  With *n_ctx*, a
    prompt that cannot fit is refused as soon as that is known.

    Raises:
        InvalidRequest: a token id is outside the vocabulary.
        ContextOverflow: with *n_ctx*, the prompt has *n_ctx* tokens or more.

    """
    tokenizer = runtime.tokenizer
    tokens: list[int] = []
    bos = tokenizer.encode("", add_special=True)[:1] if tokenizer.add_bos else []
    adds_bos = bool(bos) and prompt[:1] != (bos[0],)  # a prompt may start with the BOS id itself
    for index, piece in enumerate(prompt):
        if isinstance(piece, str):
            before = len(tokens) + adds_bos
            tokens.extend(_fitting_tokens(tokenizer, piece, n_ctx=n_ctx, param=param, before=before))
        elif 0 <= piece < tokenizer.n_vocab:
            tokens.append(piece)
        else:
            raise InvalidRequest(
                f"token id {piece} is outside the vocabulary (0..{tokenizer.n_vocab - 1})",
                param=f"{param}[{index}]" if len(prompt) > 1 else param,
            )
    if bos and tokens[:1] != bos:
        tokens[:0] = bos
    text = "".join(p if isinstance(p, str) else tokenizer.decode([p]) for p in prompt)
    return RenderedPrompt(text=text, tokens=tuple(tokens))
