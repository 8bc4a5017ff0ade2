"""Operations routes: liveness, readiness, and the paths a text model does not serve."""

from __future__ import annotations

from quart import Blueprint, Response

from bubo.errors import BuboError, NotImplementedOnThisModel
from bubo.service.runtime import Status

from ._context import api_context
from ._errors import error_envelope
from ._json import json_response, unstructure

__all__ = ["blueprint"]

blueprint = Blueprint("ops", __name__)

# Paths that exist on image-generation servers; a text model answers 501 (/rerank: api/llamacpp/rerank.py).
NOT_IMPLEMENTED = ("/sdapi/v1/<path:rest>",)


@blueprint.get("/health")
@blueprint.get("/v1/health")
@blueprint.get("/healthz")
async def health() -> Response:
    """Liveness: 200 while the process can serve or load (its model asleep too), 503 once it is lost."""
    state = api_context().state
    if state.lost:
        return json_response({"status": "device_lost"}, status=503)
    if state.runtime is not None and state.runtime.engine.sleeping:
        return json_response(
            {"status": "ok", "is_sleeping": True}
        )  # llama-server's answer, and why it is idle
    return json_response({"status": "ok"})


@blueprint.get("/ready")
@blueprint.get("/v1/ready")
@blueprint.get("/readyz")
async def ready() -> Response:
    """Readiness: 200 with the model id once loaded, else 503 with the reason."""
    state = api_context().state
    try:
        runtime = state.require_ready()
    except BuboError as error:
        body = {"status": state.readiness, **unstructure(error_envelope(error))}
        if state.status is Status.LOADING:
            body["progress"] = round(state.load_progress, 3)
        return json_response(body, status=error.status, headers=dict(error.headers))
    sleeping = {"is_sleeping": True} if runtime.engine.sleeping else {}  # ready: a request loads it again
    return json_response({"status": "ready", "model": runtime.model_id, **sleeping})


async def not_implemented(rest: str = "") -> Response:
    """501 for endpoints a text model does not serve."""
    del rest
    raise NotImplementedOnThisModel("this server serves a text model; this endpoint is not available")


for _path in NOT_IMPLEMENTED:
    blueprint.add_url_rule(
        _path, view_func=not_implemented, methods=["GET", "POST"], endpoint=f"not_implemented:{_path}"
    )
del _path
