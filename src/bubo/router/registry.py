"""The router's models and their statuses, in llama-server's shapes; no processes here.

Each model of the catalog has a :class:`ModelRecord`.  Loading it creates an
:class:`Instance` (one child process on one loopback port); the instance moves
from loading to loaded (its ``/ready`` answered 200) and ends when its process
exits.  The supervisor (``supervisor.py``) drives those moves; requests and the
``/models`` routes read them.  All of it lives on the app, never in a module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import attrs
import trio

from bubo.errors import InvalidRequest, NotFound

from .catalog import CatalogEntry

__all__ = ["Instance", "ModelRecord", "ModelState", "Registry", "exit_code_of"]

# What a child's exit code reads when a signal ended it: 128 + the signal, as shells and
# llama-server's router report it (SIGKILL: 137).
SIGNAL_EXIT_BASE = 128


def exit_code_of(returncode: int) -> int:
    """The exit code to report for a process's *returncode* (negative when a signal ended it)."""
    return SIGNAL_EXIT_BASE - returncode if returncode < 0 else returncode


class ModelState(enum.Enum):
    """``status.value`` in ``GET /models``."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"


@attrs.define(eq=False)
class Instance:
    """One child ``bubo serve`` for one model: its port, its command line and how it ends."""

    model: str
    port: int
    args: tuple[str, ...]
    pid: int | None = None
    loaded: bool = False  # its /ready answered 200
    stop_requested: bool = False  # the router asked it to stop (unload, LRU, shutdown)
    load_timed_out: bool = False
    spawn_failed: bool = False
    exit_code: int | None = None  # set once it has exited
    info: dict[str, Any] = attrs.field(factory=dict)  # the child's own /v1/models entry, once loaded
    in_flight: int = 0  # leases: requests it serves (or is loading for); a model with none is idle
    stop_timeout: float | None = None  # its preset's stop-timeout; None: the router's grace period
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)  # cancelled: stop the process
    settled: trio.Event = attrs.field(factory=trio.Event)  # loaded, or exited
    exited: trio.Event = attrs.field(factory=trio.Event)

    @property
    def base_url(self) -> str:
        """Where the child listens."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def stopping(self) -> bool:
        """Whether it was asked to stop or has stopped: no new request goes to it."""
        return self.stop_requested or self.exited.is_set()

    @property
    def failed(self) -> bool:
        """Whether it ended on its own with a failure (a requested stop never counts as one)."""
        if not self.exited.is_set():
            return False
        if self.load_timed_out or self.spawn_failed:
            return True
        return not self.stop_requested and self.exit_code != 0

    def mark_loaded(self, info: dict[str, Any]) -> None:
        """Its ``/ready`` answered 200; *info* is its ``/v1/models`` entry."""
        self.info = info
        self.loaded = True
        self.settled.set()

    def request_stop(self) -> None:
        """Ask the supervisor to stop the process (SIGTERM, SIGKILL after a grace period)."""
        self.stop_requested = True
        self.scope.cancel()

    def mark_exited(self, exit_code: int) -> None:
        """The process is gone (reaped), with *exit_code* (128 + N for signal N)."""
        self.exit_code = exit_code
        self.exited.set()
        self.settled.set()


@attrs.define(eq=False)
class ModelRecord:
    """One model of the directory: its running instance, if any, and how its last one ended."""

    entry: CatalogEntry
    instance: Instance | None = None  # running: loading, loaded, or stopping
    last: Instance | None = None  # the latest instance that ended
    last_used: float = 0.0  # trio clock of its latest load or POST request (LRU unloading)

    @property
    def name(self) -> str:
        """The model's name: what requests put in ``model``."""
        return self.entry.name

    @property
    def state(self) -> ModelState:
        """Unloaded, loading or loaded."""
        if self.instance is None:
            return ModelState.UNLOADED
        return ModelState.LOADED if self.instance.loaded else ModelState.LOADING

    @property
    def running(self) -> bool:
        """Whether a process runs for it (llama-server's ``is_running``)."""
        return self.instance is not None

    def start(self, instance: Instance, now: float) -> None:
        """*instance* begins loading."""
        self.instance = instance
        self.last_used = now

    def finish(self, instance: Instance) -> None:
        """*instance* has exited: the model is unloaded (failed if the instance failed)."""
        if self.instance is instance:
            self.instance = None
        self.last = instance

    def status(self) -> dict[str, Any]:
        """``status`` in ``GET /models``: llama-server's object."""
        current = self.instance or self.last
        body: dict[str, Any] = {"value": self.state.value}
        if current is not None:
            body["args"] = list(current.args)
        if self.instance is None and self.last is not None and self.last.failed:
            body["failed"] = True
            body["exit_code"] = self.last.exit_code if self.last.exit_code is not None else -1
        return body

    def describe(self, created: int) -> dict[str, Any]:
        """The model's entry in ``GET /models``; a loaded model adds its child's own fields."""
        entry: dict[str, Any] = {
            "id": self.name,
            "aliases": list(self.entry.aliases),
            "tags": list(self.entry.tags),
            "object": "model",
            "owned_by": "bubo",
            "created": created,
            "in_cache": False,
            "status": self.status(),
        }
        if self.instance is not None and self.instance.loaded:
            for key, value in self.instance.info.items():
                entry.setdefault(key, value)
        return entry


@attrs.define(eq=False)
class Registry:
    """Every model of the catalog by name (and by alias)."""

    records: dict[str, ModelRecord]
    departing: list[ModelRecord] = attrs.field(factory=list)  # dropped by a reload, still running

    @classmethod
    def of(cls, entries: Iterable[CatalogEntry]) -> Registry:
        """A registry with every entry unloaded."""
        return cls(records={entry.name: ModelRecord(entry=entry) for entry in entries})

    def listed(self) -> list[ModelRecord]:
        """The models ``GET /models`` shows (a preset's dedup-cache-models hides a directory twin)."""
        return [record for record in self.records.values() if record.entry.listed]

    def reload(self, entries: Iterable[CatalogEntry]) -> list[ModelRecord]:
        """Take a new catalog (``GET /models?reload=1``); the running models to unload are returned.

        As in llama-server: a model that is not running is added, updated or removed at once; one that
        runs keeps running if its entry is unchanged, and is unloaded if it changed (it loads with its
        new settings next time) or is gone (it leaves the list once it has exited).
        """
        old = self.records
        self.records = {}
        to_stop: list[ModelRecord] = []
        for entry in entries:
            record = old.pop(entry.name, None)
            if record is None:
                record = ModelRecord(entry=entry)
            elif record.entry != entry:
                if record.running:
                    to_stop.append(record)
                record.entry = entry
            self.records[entry.name] = record
        for record in old.values():  # removed from the catalog
            if record.running:
                self.departing.append(record)
                to_stop.append(record)
        return to_stop

    def forget(self, instance: Instance) -> None:
        """*instance* has exited: a model a reload removed leaves for good."""
        self.departing = [r for r in self.departing if r.instance is not None and r.instance is not instance]

    def get(self, name: str | None, *, param: str = "model") -> ModelRecord:
        """The model a request names.

        Raises:
            InvalidRequest: *name* is missing or not a string (``missing_model``).
            NotFound: no model of that name (``model_not_found``).

        """
        if name is None or name == "":
            raise InvalidRequest(
                f"the request has no model; one of: {self._names()}", code="missing_model", param=param
            )
        record = self.records.get(name) or next(
            (r for r in self.records.values() if name in r.entry.aliases), None
        )
        if record is None:
            raise NotFound(
                f"model {name!r} is not in the models directory; it has: {self._names()}",
                code="model_not_found",
                param=param,
            )
        return record

    def only_loaded(self) -> ModelRecord:
        """The model a request without ``model`` goes to: the one loaded, when exactly one is.

        Raises:
            InvalidRequest: none or several models are loaded (``missing_model``).

        """
        loaded = [r for r in self.records.values() if r.state is ModelState.LOADED]
        if len(loaded) == 1:
            return loaded[0]
        which = ", ".join(repr(r.name) for r in loaded) if loaded else "none is loaded"
        raise InvalidRequest(
            f"the request names no model and the router cannot choose ({which}): "
            "put the model in the body's model field, or ?model= on a GET",
            code="missing_model",
            param="model",
        )

    def running(self) -> list[ModelRecord]:
        """The models that have a process (loading, loaded or stopping), removed ones included."""
        return [r for r in (*self.records.values(), *self.departing) if r.running]

    def _names(self) -> str:
        return ", ".join(repr(name) for name in self.records) or "none"
