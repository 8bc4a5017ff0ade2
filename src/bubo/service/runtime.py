"""The loaded model and everything a request needs from it, plus the server's lifecycle."""

from __future__ import annotations

import enum

import attrs
import trio

from bubo.domain.requests import ChatDefaults
from bubo.domain.sampling import GenerationDefaults
from bubo.engine import Engine
from bubo.errors import DeviceLost, InvalidRequest, NotFound, ServiceUnavailable
from bubo.model import ALIAS, KvCacheSize, ModelCard
from bubo.templates import ChatTemplate
from bubo.tokenizer import Tokenizer

from .capabilities import Capabilities, capabilities_of
from .idle import IdleSleeper
from .memory import MemoryGuard
from .slot_store import SlotFileStore
from .work import Workers

__all__ = ["Runtime", "ServerState", "Status"]


@attrs.frozen(kw_only=True)
class Runtime:
    """A served model: engine, tokenizer, template and the names it answers to."""

    model_id: str
    created: int  # unix time the model was loaded
    engine: Engine
    tokenizer: Tokenizer
    template: ChatTemplate
    defaults: GenerationDefaults = attrs.field(factory=GenerationDefaults)
    tool_parser: str = "hermes"  # the format tool calls are parsed (and forced) in
    default_grammar: str | None = None  # GBNF that constrains every request that sets none itself
    memory_guard: MemoryGuard | None = None  # None: requests are not checked against memory
    max_queue: int | None = None  # requests that may wait for the slot; None: no bound
    workers: Workers = attrs.field(factory=Workers)  # heavy request work, off the event loop
    spm_infill: bool = False  # /infill: suffix before prefix (--spm-infill)
    slot_files: SlotFileStore | None = None  # where slot files are saved and restored; None: not served
    aliases: tuple[str, ...] = ()  # more names the model answers to (--alias a,b: a is the id)
    tags: tuple[str, ...] = ()  # informational (--tags), listed in /v1/models
    any_model_name: bool = False  # --model-names any: every name is this model
    chat: ChatDefaults = attrs.field(factory=ChatDefaults)
    card: ModelCard | None = None  # the model file's identity and metadata, read at load (None: no file)
    kv_cache: KvCacheSize | None = None  # the KV cache's types and size (None: not known, the fake engine)
    sleeper: IdleSleeper = attrs.field(
        factory=IdleSleeper
    )  # when the idle model is freed (--sleep-idle-seconds)

    @property
    def capabilities(self) -> Capabilities:
        """What the model is served for (``service/capabilities.py``), which every dialect lists."""
        return capabilities_of(self.engine, self.template)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name a request may use: the served id, the other aliases, and ``bubo``."""
        return tuple(dict.fromkeys((self.model_id, *self.aliases, ALIAS)))

    def check_model(self, name: str | None) -> None:
        """Accept a request's ``model`` or say why not.

        Raises:
            InvalidRequest: no model was given (``missing_model``).
            NotFound: the name is not served here (``model_not_found``).

        """
        if name is None or name == "":
            raise InvalidRequest(
                f"the request has no model; use {self.model_id!r} or {ALIAS!r}",
                code="missing_model",
                param="model",
            )
        if name not in self.model_names and not self.any_model_name:
            raise NotFound(
                f"model {name!r} is not served by this process; it serves {self.model_id!r} "
                f"(also as {', '.join(repr(n) for n in self.model_names[1:])})",
                code="model_not_found",
                param="model",
            )


class Status(enum.Enum):
    """Where the server is in its life."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DEVICE_LOST = "device_lost"
    RECOVERING = "recovering"  # lost, and the model is being reloaded (--device-recovery)


@attrs.define
class ServerState:
    """Mutable lifecycle state, owned by the app (never module-level).

    The model task moves it from ``LOADING`` to ``READY`` (or ``FAILED``), and
    from ``READY`` to ``DEVICE_LOST`` (then ``RECOVERING`` and back to ``READY``
    with ``--device-recovery``); request handlers only read it.
    """

    status: Status = Status.LOADING
    runtime: Runtime | None = None
    load_progress: float = 0.0
    failure: str | None = None
    stopping: bool = False  # a shutdown signal arrived: admit nothing new
    draining: bool = False  # a shutdown signal arrived: /ready is 503, requests are still admitted
    first_load_settled: trio.Event = attrs.field(factory=trio.Event)  # READY or FAILED once

    def settle(self, status: Status) -> None:
        """Leave loading for *status* (``READY`` or ``FAILED``)."""
        self.status = status
        self.first_load_settled.set()

    @property
    def readiness(self) -> str:
        """What ``/ready`` says: ready, not_ready (loading), failed, stopping, device_lost or recovering."""
        if self.stopping or self.draining:
            return "stopping"
        if self.status is Status.RECOVERING:
            return "recovering"
        if self.lost:
            return "device_lost"
        return {Status.READY: "ready", Status.FAILED: "failed"}.get(self.status, "not_ready")

    @property
    def lost(self) -> bool:
        """Whether the engine was lost (and is perhaps being reloaded)."""
        engine_lost = self.runtime is not None and self.runtime.engine.lost
        return engine_lost or self.status in (Status.DEVICE_LOST, Status.RECOVERING)

    @property
    def busy(self) -> bool:
        """Whether a generation runs or waits for the slot."""
        if self.runtime is None:
            return False
        engine = self.runtime.engine
        return bool(engine.requests_running or engine.requests_waiting)

    def require_runtime(self) -> Runtime:
        """The runtime, or the 503 that says why there is none yet.

        Raises:
            ServiceUnavailable: loading, failed or shutting down (``not_ready``).
            DeviceLost: the engine was lost.

        """
        if self.stopping:
            raise ServiceUnavailable("the server is shutting down", code="not_ready")
        if self.lost:
            recovering = " (the model is being reloaded)" if self.status is Status.RECOVERING else ""
            raise DeviceLost("the engine failed and cannot serve requests" + recovering)
        if self.status is Status.READY and self.runtime is not None:
            return self.runtime
        if self.status is Status.FAILED:
            raise ServiceUnavailable(f"the model failed to load: {self.failure}", code="not_ready")
        raise ServiceUnavailable(
            f"the model is loading ({self.load_progress:.0%})", code="not_ready", headers={"Retry-After": "1"}
        )

    def require_ready(self) -> Runtime:
        """What ``/ready`` asks: the runtime, unless a shutdown signal arrived (``--drain-delay``).

        While draining, requests are still admitted (:meth:`require_runtime`);
        only readiness turns, so that a gateway's health check takes this
        server out of rotation before it refuses anything.

        Raises:
            ServiceUnavailable: draining, loading, failed or shutting down (``not_ready``).
            DeviceLost: the engine was lost.

        """
        if self.draining:
            raise ServiceUnavailable(
                "the server is shutting down: it serves the requests that still reach it until --drain-delay "
                "ends, then refuses new ones",
                code="not_ready",
            )
        return self.require_runtime()
