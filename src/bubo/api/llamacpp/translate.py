"""llama-server wire ↔ domain."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from bubo.api._constraints import output_constraint
from bubo.api._images import image_bytes
from bubo.api._llama_fields import lora_scales
from bubo.api._numbers import check_bias, check_token_limit, draft_overrides, sampling_overrides, token_id
from bubo.api._stops import stop_strings
from bubo.api._usage import timings, usage
from bubo.domain.generation import GenerationRequest, StopCause, TokenLogprob
from bubo.domain.media import DEFAULT_MEDIA_MARKER, ImageInput
from bubo.domain.output import Done
from bubo.domain.requests import CompletionRequest, GenerationOptions, PromptPiece
from bubo.domain.samplers import KNOBS
from bubo.domain.sampling import BANNED, LogitBias, SamplingParams
from bubo.engine import SlotStatistics
from bubo.errors import InvalidRequest
from bubo.model import KvCacheSize

from . import wire

__all__ = [
    "RawPrompt",
    "completion_request",
    "completion_result",
    "probabilities",
    "project",
    "prompts",
    "sampler_settings",
    "slot",
    "token_piece",
]

_STOP_TYPES = {
    StopCause.EOS: "eos",
    StopCause.STOP_WORD: "word",
    StopCause.LIMIT: "limit",
    StopCause.CONTEXT: "limit",
    StopCause.TIME: "limit",
}
_MAX_N_PROBS = 100
MAX_RESPONSE_FIELDS = 64
"""Paths in ``response_fields``: each is looked up in every result of the request."""
MAX_RESPONSE_FIELD_CHARS = 256
"""Characters of one ``response_fields`` path."""


@attrs.frozen
class RawPrompt:
    """One prompt of a ``/completion`` body: its pieces, and the images its ``<__media__>`` markers place."""

    pieces: tuple[PromptPiece, ...]
    images: tuple[ImageInput, ...] = ()


def prompts(body: wire.CompletionRequest, *, takes_images: bool = False) -> list[RawPrompt]:
    """The prompts of a ``/completion`` body, as llama-server reads ``prompt``.

    A text, an array of token ids, an array mixing ids and texts, or an object
    (``{"prompt_string": …}``) is one prompt; an array of texts, of such arrays
    and of objects is several.  An object's ``multimodal_data`` (base64 images,
    each read where ``prompt_string`` writes ``<__media__>``) needs a model that
    takes images (*takes_images*).

    Raises:
        InvalidRequest: no prompt, an empty one among several, a bare token id beside arrays,
            ``multimodal_data`` for a text model, not base64, or not one image per marker.

    """
    prompt = body.prompt
    if prompt is None or prompt in ("", []):
        raise InvalidRequest("prompt is required", code="missing_prompt", param="prompt")
    if isinstance(prompt, str):
        return [RawPrompt((prompt,))]
    if isinstance(prompt, wire.PromptObject):
        return [_object_prompt(prompt, "prompt", takes_images=takes_images)]
    nested = any(isinstance(piece, list | wire.PromptObject) for piece in prompt)
    if any(isinstance(piece, int) for piece in prompt):  # one prompt: ids, or ids and texts mixed
        if nested:
            index = next(i for i, piece in enumerate(prompt) if isinstance(piece, int))
            raise InvalidRequest(
                "several prompts are texts, arrays of token ids and texts, or objects; a bare token id is "
                "not one",
                param=f"prompt[{index}]",
            )
        return [RawPrompt(tuple(piece for piece in prompt if isinstance(piece, int | str)))]
    out: list[RawPrompt] = []
    for index, piece in enumerate(prompt):
        where = f"prompt[{index}]"
        if isinstance(piece, wire.PromptObject):
            one = _object_prompt(piece, where, takes_images=takes_images)
        elif isinstance(piece, list):
            one = RawPrompt(tuple(piece))
        else:  # a text (a bare id was refused above)
            one = RawPrompt((piece,))
        if one.pieces in ((), ("",)):
            raise InvalidRequest("a prompt must not be empty", param=where)
        out.append(one)
    return out


def _object_prompt(prompt: wire.PromptObject, param: str, *, takes_images: bool) -> RawPrompt:
    """The prompt of ``{"prompt_string": text or ids and texts, "multimodal_data": [base64, …]}``."""
    data = prompt.multimodal_data
    if data and not takes_images:
        raise InvalidRequest(
            "this model takes text only: a prompt cannot carry multimodal_data",
            param=f"{param}.multimodal_data",
        )
    text = prompt.prompt_string
    if text is None or text in ("", []):
        raise InvalidRequest("a prompt object needs its prompt_string", param=f"{param}.prompt_string")
    if not data:
        return RawPrompt((text,) if isinstance(text, str) else tuple(text))
    if not isinstance(text, str):
        raise InvalidRequest(
            "a prompt with multimodal_data is a text (its prompt_string), not token ids",
            param=f"{param}.prompt_string",
        )
    n_markers = text.count(DEFAULT_MEDIA_MARKER)
    if n_markers != len(data):
        raise InvalidRequest(
            f"prompt_string holds {n_markers} {DEFAULT_MEDIA_MARKER} markers for {len(data)} multimodal_data "
            "items: write one marker where each goes, in order",
            param=f"{param}.multimodal_data",
        )
    where = f"{param}.multimodal_data"
    images = tuple(
        ImageInput(data=image_bytes(item, f"{where}[{i}]", data_uri=False), param=f"{where}[{i}]")
        for i, item in enumerate(data)
    )
    return RawPrompt((text,), images)


def completion_request(
    body: wire.CompletionRequest, prompt: tuple[PromptPiece, ...], images: tuple[ImageInput, ...] = ()
) -> CompletionRequest:
    """The domain request for one prompt of a ``/completion`` body (:func:`prompts`) and its images.

    Raises:
        InvalidRequest: a bad ``n_predict``, ``n_probs``, ``logit_bias``, ``n_indent`` or
            ``response_fields``, a sampler setting out of range.

    """
    n_predict, param = (
        (body.n_predict, "n_predict") if body.n_predict is not None else (body.max_tokens, "max_tokens")
    )
    if n_predict is not None and n_predict < -1:
        raise InvalidRequest(f"{param} must be -1 (no limit) or at least 0, got {n_predict}", param=param)
    check_token_limit(n_predict, param)
    if body.n_probs is not None and not 0 <= body.n_probs <= _MAX_N_PROBS:
        raise InvalidRequest(f"n_probs must be between 0 and {_MAX_N_PROBS}", param="n_probs")
    if body.t_max_predict_ms is not None and body.t_max_predict_ms < 0:
        raise InvalidRequest("t_max_predict_ms must not be negative", param="t_max_predict_ms")
    if body.n_indent is not None and body.n_indent < 0:
        raise InvalidRequest("n_indent must not be negative", param="n_indent")
    _check_response_fields(body.response_fields or [])
    stop = stop_strings(body.stop, "stop")
    output_format, grammar = output_constraint(grammar=body.grammar, json_schema=body.json_schema)
    return CompletionRequest(
        prompt=prompt,
        options=GenerationOptions(
            max_tokens=n_predict,
            sampling=sampling_overrides(body, _logit_bias(body.logit_bias)),
            stop=stop,
            n_probs=body.n_probs or None,
            ignore_eos=bool(body.ignore_eos),
            lora=lora_scales(body.lora),
            time_limit_ms=body.t_max_predict_ms or 0,
            slot=None if body.id_slot in (None, -1) else body.id_slot,
            n_keep=None if body.n_keep is None else max(body.n_keep, -1),
            cache_prompt=body.cache_prompt is not False,
            n_indent=body.n_indent or 0,
            post_sampling_probs=bool(body.post_sampling_probs),
            speculative=draft_overrides(body),
        ),
        output_format=output_format,
        grammar=grammar,
        images=images,
        media_marker=DEFAULT_MEDIA_MARKER,
    )


def _check_response_fields(fields: Sequence[str]) -> None:
    if len(fields) > MAX_RESPONSE_FIELDS:
        raise InvalidRequest(
            f"response_fields names {len(fields)} fields; at most {MAX_RESPONSE_FIELDS} are accepted",
            param="response_fields",
        )
    for index, field in enumerate(fields):
        if len(field) > MAX_RESPONSE_FIELD_CHARS:
            raise InvalidRequest(
                f"a response field is at most {MAX_RESPONSE_FIELD_CHARS} characters, not {len(field)}",
                param=f"response_fields[{index}]",
            )


def _bias_value(value: Any, param: str) -> float:
    if value is False:
        return BANNED
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest("a logit bias is a number, or false to ban the token", param=param)
    return check_bias(float(value), param)


def _bias_target(value: Any, param: str) -> int | str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidRequest("a logit bias names a token id or a text", param=param)


def _logit_bias(bias: list[list[Any]] | dict[str, Any] | None) -> LogitBias:
    """``[[token or text, bias or false], …]`` or ``{"token or text": bias, …}``."""
    if not bias:
        return ()
    out: list[tuple[int | str, float]] = []
    if isinstance(bias, dict):
        for key, value in bias.items():
            param = f"logit_bias.{key}"
            token = token_id(key, param)
            out.append((key if token is None else token, _bias_value(value, param)))
        return tuple(out)
    for index, pair in enumerate(bias):
        param = f"logit_bias[{index}]"
        if len(pair) != 2:
            raise InvalidRequest("each logit bias is a [token, bias] pair", param=param)
        out.append((_bias_target(pair[0], f"{param}[0]"), _bias_value(pair[1], f"{param}[1]")))
    return tuple(out)


def token_piece(piece: bytes) -> str | list[int]:
    """A piece as text when it is valid UTF-8, else as its byte values."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def probabilities(entries: Sequence[TokenLogprob], *, post_sampling: bool = False) -> wire.Probabilities:
    """``completion_probabilities`` entries; after the sampler chain, as probabilities (``prob``)."""
    if post_sampling:
        return [
            wire.PostProbability(
                id=e.token_id,
                token=e.piece.decode("utf-8", errors="replace"),
                bytes=list(e.piece),
                prob=math.exp(e.logprob),
                top_probs=[
                    wire.TopPostProbability(
                        id=t.token_id,
                        token=t.piece.decode("utf-8", errors="replace"),
                        bytes=list(t.piece),
                        prob=math.exp(t.logprob),
                    )
                    for t in e.top
                ],
            )
            for e in entries
        ]
    return [
        wire.Probability(
            id=e.token_id,
            token=e.piece.decode("utf-8", errors="replace"),
            bytes=list(e.piece),
            logprob=e.logprob,
            top_logprobs=[
                wire.TopProbability(
                    id=t.token_id,
                    token=t.piece.decode("utf-8", errors="replace"),
                    bytes=list(t.piece),
                    logprob=t.logprob,
                )
                for t in e.top
            ],
        )
        for e in entries
    ]


def sampler_settings(sampling: SamplingParams) -> dict[str, Any]:
    """The fields of :class:`wire.SamplerSettings` for *sampling*.

    The one mapping from the domain to the wire's sampler fields, the table's knobs
    (``domain.samplers.KNOBS``) and the rest: ``generation_settings`` and ``/props`` both use it.
    """
    return {
        **{knob.name: getattr(sampling, knob.name) for knob in KNOBS},
        "seed": 0xFFFFFFFF if sampling.seed is None else sampling.seed,
        "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
        "samplers": list(sampling.samplers),
    }


def generation_settings(
    request: GenerationRequest, *, n_ctx: int, model: str, stream: bool
) -> wire.GenerationSettings:
    """The settings the generation ran with."""
    return wire.GenerationSettings(
        **sampler_settings(request.sampling),
        n_ctx=n_ctx,
        n_predict=-1 if request.max_new_tokens is None else request.max_new_tokens,
        model=model,
        stop=list(request.stop),
        n_probs=request.n_probs or 0,
        ignore_eos=request.ignore_eos,
        stream=stream,
        n_keep=request.n_keep,
        n_indent=request.n_indent,
        cache_prompt=request.cache_prompt,
        speculative_n_max=request.speculative.n_max,
        speculative_n_min=request.speculative.n_min,
        speculative_p_min=request.speculative.p_min,
        logit_bias=[
            wire.LogitBiasEntry(token=token, bias=None if bias == BANNED else bias)
            for token, bias in request.sampling.logit_bias
        ],
    )


def completion_result(
    *,
    content: str,
    done: Done,
    settings: wire.GenerationSettings,
    prompt: str,
    probabilities: wire.Probabilities | None,
    has_new_line: bool,
    tokens: Sequence[int] = (),
    index: int = 0,
) -> wire.CompletionResult:
    """The final ``/completion`` object (whole response, or the last stream chunk).

    ``truncated``: the context ran out, whether the generation stopped there or shifted it to go on.
    """
    stats = done.stats
    return wire.CompletionResult(
        index=index,
        content=content,
        tokens=list(tokens),
        id_slot=stats.slot_id,
        stop=True,
        model=settings.model,
        tokens_predicted=stats.completion_tokens,
        tokens_evaluated=stats.prompt_tokens,
        generation_settings=settings,
        prompt=prompt,
        has_new_line=has_new_line,
        truncated=done.cause is StopCause.CONTEXT or stats.context_shifts > 0,
        stop_type=_STOP_TYPES[done.cause],
        stopping_word=done.stop_word or "",
        tokens_cached=stats.prompt_tokens + stats.completion_tokens,
        timings=timings(stats),
        usage=usage(stats),
        completion_probabilities=probabilities,
    )


def project(result: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """llama-server's ``response_fields``: only the fields named, a nested one (``a/b``) under its path.

    A field that is not there is left out without an error.
    """
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = result
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


IDLE_NEXT_TOKEN = wire.NextToken(has_next_token=False, n_decoded=0, n_remain=-1)
"""An idle slot's ``next_token``, as llama-server reports it."""


def kv_cache(size: KvCacheSize | None) -> wire.KvCache | None:
    """``/props``' ``kv_cache``: the cache's types and memory, and what they save against f16."""
    if size is None:
        return None
    return wire.KvCache(
        type_k=size.type_k,
        type_v=size.type_v,
        n_ctx=size.n_ctx,
        size_bytes=size.bytes,
        size_mib=round(size.bytes / 2**20, 2),
        f16_bytes=size.f16_bytes,
        saved_bytes=size.saved_bytes,
        saved_share=round(size.saved_bytes / size.f16_bytes, 4) if size.f16_bytes else 0.0,
    )


def lora_list(scales: Sequence[float]) -> list[wire.LoraScaleEntry]:
    """Every adapter's scale, as llama-server lists them (``[{"id": 0, "scale": 1.0}, ...]``)."""
    return [wire.LoraScaleEntry(id=i, scale=scale) for i, scale in enumerate(scales)]


def slot(stats: SlotStatistics, *, speculative: bool = False, sleeping: bool = False) -> wire.Slot:
    """One ``/slots`` entry; *speculative*: a draft model drafts for it (llama-server's ``speculative``).

    A slot that has run no task yet (``id_task`` -1) shows no task fields, as llama-server's.
    """
    entry = wire.Slot(
        id=stats.id,
        n_ctx=stats.n_ctx,
        speculative=speculative,
        is_processing=stats.is_processing,
        is_sleeping=sleeping,
        state="processing" if stats.is_processing else "idle",
        n_prompt_tokens=stats.n_prompt_tokens,
        n_prompt_tokens_processed=stats.n_prompt_tokens_processed,
        n_prompt_tokens_cache=stats.n_prompt_tokens_cache,
        shared_tokens=stats.n_prompt_tokens_shared,
    )
    if stats.id_task < 0:
        return entry
    return attrs.evolve(
        entry,
        id_task=stats.id_task,
        params=wire.SlotParams(lora=lora_list(stats.lora)),
        next_token=[
            wire.NextToken(has_next_token=True, n_decoded=stats.n_decoded, n_remain=stats.n_remain)
            if stats.is_processing
            else IDLE_NEXT_TOKEN  # a finished task's budget does not stay on the idle slot
        ],
    )
