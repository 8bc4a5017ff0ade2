"""Chat and raw prompts to token ids: the one render-and-tokenize path.

Generation, ``/apply-template``, ``/tokenize``-free counting and Anthropic's
``count_tokens`` all call these, so their token counts agree by construction.
"""

from __future__ import annotations

import re

import attrs

from bubo.domain.messages import ChatPrompt
from bubo.domain.requests import PromptPiece
from bubo.errors import InvalidRequest

from .runtime import Runtime

__all__ = ["RenderedPrompt", "render_chat", "stable_prompt", "tokenize_raw"]


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


def render_chat(runtime: Runtime, prompt: ChatPrompt) -> RenderedPrompt:
    """Render *prompt* with the chat template and tokenize it.

    A template that prints the BOS token itself (Gemma, Llama 3) would double it
    when the tokenizer adds BOS too; the printed one is dropped, as llama.cpp does.
    """
    text = runtime.template.render(stable_prompt(prompt))
    tokenizer = runtime.tokenizer
    if tokenizer.add_bos and tokenizer.bos_token and text.startswith(tokenizer.bos_token):
        text = text[len(tokenizer.bos_token) :]
    return RenderedPrompt(text=text, tokens=tuple(tokenizer.encode(text, add_special=True)))


def tokenize_raw(
    runtime: Runtime, prompt: tuple[PromptPiece, ...], *, param: str = "prompt"
) -> RenderedPrompt:
    """Tokenize a raw prompt of text and/or token ids (llama-server's ``prompt``).

    The model's BOS is added in front, as llama-server does.

    Raises:
        InvalidRequest: a token id is outside the vocabulary.

    """
    tokenizer = runtime.tokenizer
    tokens: list[int] = []
    for index, piece in enumerate(prompt):
        if isinstance(piece, str):
            tokens.extend(tokenizer.encode(piece))
        elif 0 <= piece < tokenizer.n_vocab:
            tokens.append(piece)
        else:
            raise InvalidRequest(
                f"token id {piece} is outside the vocabulary (0..{tokenizer.n_vocab - 1})",
                param=f"{param}[{index}]" if len(prompt) > 1 else param,
            )
    if tokenizer.add_bos:
        bos = tokenizer.encode("", add_special=True)[:1]
        if tokens[:1] != bos:
            tokens[:0] = bos
    text = "".join(p if isinstance(p, str) else tokenizer.decode([p]) for p in prompt)
    return RenderedPrompt(text=text, tokens=tuple(tokens))
