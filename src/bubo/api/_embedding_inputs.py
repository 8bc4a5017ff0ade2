"""The ``input`` of an embeddings request, as OpenAI and llama-server accept it."""

from __future__ import annotations

from bubo.errors import InvalidRequest
from bubo.service.embeddings import EmbeddingInput

__all__ = ["MAX_EMBEDDING_INPUTS", "embedding_inputs"]

MAX_EMBEDDING_INPUTS = 2048
"""Inputs in one request, as OpenAI limits them: a longer list would hold a worker for everyone else."""


def embedding_inputs(value: object, param: str, *, max_tokens: int) -> list[EmbeddingInput]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids (400 otherwise).

    A list of token ids longer than *max_tokens* (one embedding's batch) is refused before its ids
    are looked at: the body may hold millions, and this runs on the event loop.
    """
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            f"{param} must be a string, token ids, or a non-empty list of either", param=param
        )
    if _is_token(value[0]):
        _check_length(value, param, max_tokens)
    if all(_is_token(item) for item in value):
        return [tuple(value)]
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(
            f"{param} holds {len(value)} inputs; at most {MAX_EMBEDDING_INPUTS} are accepted in one request",
            param=param,
        )
    inputs: list[EmbeddingInput] = []
    for index, item in enumerate(value):
        if isinstance(item, list):
            _check_length(item, f"{param}[{index}]", max_tokens)
        if isinstance(item, str):
            inputs.append(item)
        elif isinstance(item, list) and all(_is_token(token) for token in item):
            inputs.append(tuple(item))
        else:
            raise InvalidRequest(
                "each input must be a string or a list of token ids", param=f"{param}[{index}]"
            )
    return inputs


def _check_length(ids: list[object], param: str, max_tokens: int) -> None:
    if len(ids) > max_tokens:
        raise InvalidRequest(
            f"the input has {len(ids)} tokens, more than the {max_tokens} one embedding may have; shorten "
            "it or start the server with a larger --ubatch-size",
            code="context_length_exceeded",
            param=param,
        )


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
