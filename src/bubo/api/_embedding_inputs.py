"""The ``input`` (or ``content``) of an embeddings request, in the shapes OpenAI and llama-server accept.

One input is a text, an array of token ids, an array mixing ids and texts,
``{"prompt_string": …}`` (llama-server's multimodal shape, text only here) or
``{"content": [{"type": "text", "text": …}, …]}`` (the chat content parts
llama-server takes; the texts are joined).  An array without token ids is
several inputs, one embedding each.
"""

from __future__ import annotations

from collections.abc import Mapping

from bubo.errors import InvalidRequest
from bubo.service.embeddings import EmbeddingInput, too_long

__all__ = ["MAX_EMBEDDING_INPUTS", "embedding_inputs"]

MAX_EMBEDDING_INPUTS = 2048
"""Inputs in one request, as OpenAI limits them: a longer list would hold a worker for everyone else."""
MEDIA_PARTS = frozenset({"image_url", "input_audio", "input_video", "image", "file"})
"""Content parts with media in them: a text model cannot embed them."""


def embedding_inputs(value: object, param: str, *, max_tokens: int) -> list[EmbeddingInput]:
    """The inputs of *value* (400, naming the bad element, for what is none of the shapes).

    A list of token ids longer than *max_tokens* (one embedding's batch) is refused before its ids
    are looked at: the body may hold millions (this runs in a worker, with the body's parse).
    """
    if isinstance(value, list):
        if not value:
            raise InvalidRequest(
                f"{param} must be a string, token ids, or a non-empty list of either", param=param
            )
        if _is_token(value[0]) or any(_is_token(item) for item in value):  # one input of ids (and texts)
            return [_one(value, param, max_tokens)]
        if len(value) > MAX_EMBEDDING_INPUTS:
            raise InvalidRequest(
                f"{param} holds {len(value)} inputs; at most {MAX_EMBEDDING_INPUTS} are accepted in one "
                "request",
                param=param,
            )
        return [_one(item, f"{param}[{index}]", max_tokens) for index, item in enumerate(value)]
    return [_one(value, param, max_tokens)]


def _one(value: object, param: str, max_tokens: int) -> EmbeddingInput:
    """One input: a text, ids (with texts), or an object holding either."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        _check_length(value, param, max_tokens)
        for index, item in enumerate(value):
            if not (_is_token(item) or isinstance(item, str)):
                raise InvalidRequest(
                    "an input's array holds token ids and texts only", param=f"{param}[{index}]"
                )
        return tuple(value)
    if isinstance(value, Mapping):
        if "prompt_string" in value:
            if value.get("multimodal_data"):
                raise InvalidRequest(
                    "this model takes text only: an input cannot carry multimodal_data",
                    param=f"{param}.multimodal_data",
                )
            text = value["prompt_string"]
            if isinstance(text, Mapping):
                raise InvalidRequest("prompt_string is a text or token ids", param=f"{param}.prompt_string")
            return _one(text, f"{param}.prompt_string", max_tokens)
        if "content" in value:
            return _content_text(value["content"], f"{param}.content")
    raise InvalidRequest(
        "each input must be a string, a list of token ids, {prompt_string: …} or {content: [text parts]}",
        param=param,
    )


def _content_text(parts: object, param: str) -> str:
    """The texts of chat content parts, joined as llama-server joins them; media is refused."""
    if not isinstance(parts, list):
        raise InvalidRequest("content must be an array of content parts", param=param)
    texts = []
    for index, part in enumerate(parts):
        where = f"{param}[{index}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in MEDIA_PARTS:
            raise InvalidRequest(
                f"this model embeds text only, not {kind} parts", code="not_multimodal", param=f"{where}.type"
            )
        else:
            raise InvalidRequest("a content part is {type: text, text: …}", param=where)
    return "".join(texts)


def _check_length(ids: list[object], param: str, max_tokens: int) -> None:
    if len(ids) > max_tokens:
        raise too_long(len(ids), max_tokens, param)


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
