"""What a load-balancing gateway asks a worker: the model it serves, its limits and its load right now.

The Shepherd Model Gateway (``smg``, SGLang's router before it) registers a
worker by reading SGLang's ``/server_info`` and ``/model_info`` (falling back
to ``/get_server_info`` and ``/get_model_info``), and polls ``/v1/loads``
every ``--load-monitor-interval`` for the numbers its load-aware policies
(``power_of_two``, ``least_load``, ``cache_aware``'s KV triggers) and its
overload protection read.  These routes answer in those shapes with what
they mean for Bubo (docs/operations.md, "Behind a load-balancing gateway"):

- the model is the served id (``--alias``' first name); the other names a
  request may use are listed, and a gateway maps them with its own aliases;
- the running requests hold a slot (``--parallel``), the waiting ones queue
  for one (up to ``--max-queue``);
- KV usage is what the running requests pin: the cells their sequences hold
  over the cache's capacity.  Idle slots' cached prefixes are not counted:
  they are evicted before any running request is ended, as SGLang's radix
  cache counts evictable tokens free, and the replica holding a session's
  cache would otherwise look the most loaded;
- the waiting tokens are the prompt positions nobody has read yet (queued
  prompts whole, as some may be found cached once a slot comes).

Bubo does not answer vLLM's ``/version``: a gateway that finds it takes the
server for vLLM and no longer reads ``/server_info``.
"""

from __future__ import annotations

import datetime as dt

import attrs
from quart import Blueprint, Response

from bubo.engine import EngineStatistics
from bubo.service.runtime import Runtime

from ._context import api_context, require_runtime
from ._json import json_response

__all__ = ["LoadSnapshot", "ModelInfo", "ServerInfo", "WorkerLoads", "blueprint"]

blueprint = Blueprint("gateway", __name__)


@attrs.frozen(kw_only=True)
class ServerInfo:
    """``GET /server_info``: SGLang's fields a gateway registers a worker with, Bubo's values."""

    model_id: str  # the served id: what the gateway routes a request's ``model`` by
    served_model_name: str
    served_model_names: list[str]  # every name a request may use here (the gateway maps them: --model-alias)
    model_path: str
    context_length: int  # the most tokens one request may hold, prompt and output
    max_total_tokens: int  # what the KV cache holds, all slots together
    max_running_requests: int  # --parallel
    max_queued_requests: int | None = None  # --max-queue; absent: no bound
    is_embedding: bool  # an encoder that only embeds or ranks
    tp_size: int = 1  # one process, one model copy: no tensor parallelism
    dp_size: int = 1  # ... and one data-parallel rank
    version: str


@attrs.frozen(kw_only=True)
class ModelInfo:
    """``GET /model_info``: what kind of model is served (SGLang's shape)."""

    model_path: str
    model_type: str  # the GGUF's general.architecture ("llama", "qwen2", "bert", …)
    is_generation: bool
    has_image_understanding: bool  # a projector is loaded (--mmproj)
    has_audio_understanding: bool = False


@attrs.frozen(kw_only=True)
class LoadSnapshot:
    """One data-parallel rank's load (Bubo has one): the fields of SGLang's ``/v1/loads`` a gateway reads."""

    dp_rank: int = 0
    num_running_reqs: int  # requests holding a slot
    num_waiting_reqs: int  # requests queued for one
    num_total_reqs: int
    num_waiting_uncached_tokens: int  # prompt positions not read yet (queued prompts whole)
    num_used_tokens: int  # KV cells the running requests hold
    num_total_tokens: int  # those cells and the prompt positions still to read: the tokens in flight
    max_total_num_tokens: int  # KV cells in all
    max_running_requests: int  # slots
    token_usage: float  # num_used_tokens / max_total_num_tokens
    gen_throughput: float  # generated tokens per second of generating, over the server's life
    cache_hit_rate: float  # prompt tokens served from the cache / all prompt tokens, over the server's life


@attrs.frozen(kw_only=True)
class WorkerLoads:
    """``GET /v1/loads``: the load right now."""

    timestamp: str  # when it was read, ISO 8601 in UTC
    version: str
    dp_rank_count: int = 1
    loads: list[LoadSnapshot]


def server_info(runtime: Runtime, *, version: str) -> ServerInfo:
    """*runtime*'s model and limits as ``/server_info`` gives them."""
    info = runtime.engine.info
    return ServerInfo(
        model_id=runtime.model_id,
        served_model_name=runtime.model_id,
        served_model_names=list(runtime.model_names),
        model_path=info.path,
        context_length=info.n_ctx,
        max_total_tokens=runtime.engine.statistics().kv_cache_capacity,
        max_running_requests=runtime.engine.n_slots,
        max_queued_requests=runtime.max_queue,
        is_embedding=not info.generates,
        version=version,
    )


def model_info(runtime: Runtime) -> ModelInfo:
    """*runtime*'s model as ``/model_info`` gives it."""
    info = runtime.engine.info
    return ModelInfo(
        model_path=info.path,
        model_type=info.architecture,
        is_generation=info.generates,
        has_image_understanding=runtime.engine.vision is not None,
    )


def load_snapshot(statistics: EngineStatistics, *, n_slots: int) -> LoadSnapshot:
    """The engine's counts as one rank's load."""
    running, waiting = statistics.requests_processing, statistics.requests_deferred
    return LoadSnapshot(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_total_reqs=running + waiting,
        num_waiting_uncached_tokens=statistics.prompt_tokens_waiting,
        num_used_tokens=statistics.kv_cache_tokens_running,
        num_total_tokens=statistics.kv_cache_tokens_running + statistics.prompt_tokens_waiting,
        max_total_num_tokens=statistics.kv_cache_capacity,
        max_running_requests=n_slots,
        token_usage=statistics.kv_cache_running_ratio,
        gen_throughput=statistics.generation_rate,
        cache_hit_rate=statistics.prompt_cache_hit_ratio,
    )


@blueprint.get("/server_info")
@blueprint.get("/get_server_info")
async def get_server_info() -> Response:
    """The served model, its names and the server's limits (503 until the model is loaded)."""
    return json_response(server_info(require_runtime(), version=api_context().version))


@blueprint.get("/model_info")
@blueprint.get("/get_model_info")
async def get_model_info() -> Response:
    """What kind of model is served (503 until it is loaded)."""
    return json_response(model_info(require_runtime()))


@blueprint.get("/v1/loads")
async def loads() -> Response:
    """The load right now; SGLang's ``include`` sections beyond the core are not reported."""
    runtime = require_runtime()
    engine = runtime.engine
    return json_response(
        WorkerLoads(
            timestamp=dt.datetime.now(dt.UTC).isoformat(),
            version=api_context().version,
            loads=[load_snapshot(engine.statistics(), n_slots=engine.n_slots)],
        )
    )
