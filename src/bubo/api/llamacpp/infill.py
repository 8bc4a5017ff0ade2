"""llama-server's ``POST /infill``: fill in the middle, answered as ``/completion`` answers."""

from __future__ import annotations

import attrs
from quart import Response

from bubo.api._context import read_body, require_runtime
from bubo.domain.requests import CompletionRequest
from bubo.errors import InvalidRequest, NotImplementedOnThisModel
from bubo.service.generation import prepare_completion
from bubo.service.infill import ExtraChunk, InfillParts, chunk_chars, infill_tokens
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from . import translate, wire
from .routes import answer_completion, blueprint, check_id_slot

__all__ = ["InfillChunk", "InfillRequest"]


@attrs.frozen(kw_only=True)
class InfillChunk:
    """One ``input_extra`` item: a file of context."""

    text: str
    filename: str | None = None


@attrs.frozen(kw_only=True)
class InfillRequest(wire.CompletionRequest):
    """``POST /infill``: every ``/completion`` field; ``prompt`` (optional) continues the prefix."""

    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[InfillChunk] | None = None


@blueprint.post("/infill")
async def infill() -> Response:
    """Fill-in-the-middle with the model's FIM tokens (501 ``not_implemented`` for a model that has none)."""
    runtime = require_runtime()
    info = runtime.engine.info
    if info.fim is None:
        raise NotImplementedOnThisModel(
            "infill is not supported by this model: its vocabulary has no fill-in-the-middle tokens "
            "(prefix, suffix and middle); use a code model trained for FIM, such as Qwen2.5-Coder"
        )
    fim = info.fim

    def translated(body: InfillRequest) -> InfillParts:
        if body.model is not None:
            runtime.check_model(body.model)
        parts = _parts(body)
        check_id_slot(runtime, body.id_slot)
        return parts

    body, parts = await read_body(runtime, InfillRequest, translated)
    n_predict = body.n_predict if body.n_predict is not None else body.max_tokens
    if n_predict is None:
        n_predict = runtime.defaults.n_predict

    def prompt_request() -> tuple[InfillRequest, CompletionRequest]:
        """The prompt's tokens around the gap, and the completion of them (a job for the workers)."""
        tokens = infill_tokens(
            runtime.tokenizer,
            fim,
            parts,
            n_batch=info.n_batch,
            n_ctx=info.n_ctx,
            n_predict=max(0, n_predict),
            spm=runtime.spm_infill,
        )
        completion = attrs.evolve(body, prompt=list[int | str | list[int | str] | wire.PromptObject](tokens))
        return completion, translate.completion_request(completion, tuple(tokens))

    completion, request = await runtime.workers.run(
        prompt_request, need_bytes=chunk_chars(parts) * PREPARE_BYTES_PER_CHAR
    )
    prepared = await prepare_completion(runtime, request)
    return await answer_completion(runtime, completion, [prepared])


def _parts(body: InfillRequest) -> InfillParts:
    """The text around the gap; 400 for a missing part or a ``prompt`` that is not text."""
    if body.input_prefix is None:
        raise InvalidRequest("input_prefix is required (it may be empty)", param="input_prefix")
    if body.input_suffix is None:
        raise InvalidRequest("input_suffix is required (it may be empty)", param="input_suffix")
    if body.prompt is not None and not isinstance(body.prompt, str):
        raise InvalidRequest("prompt must be a string on /infill", param="prompt")
    return InfillParts(
        prefix=body.input_prefix,
        suffix=body.input_suffix,
        prompt=body.prompt or "",
        extra=tuple(
            ExtraChunk(text=chunk.text)
            if chunk.filename is None
            else ExtraChunk(text=chunk.text, filename=chunk.filename)
            for chunk in body.input_extra or ()
        ),
    )
