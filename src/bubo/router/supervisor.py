"""Child processes: started on first use, health-checked over HTTP, stopped by PID.

The :class:`Supervisor` owns a nursery tied to the app's lifespan; each
instance runs in it as ``trio.run_process`` (the process is reaped there, its
exit code recorded) on a loopback socket the supervisor binds and hands to it
(``child.py``), beside a task that polls the child's ``/ready`` until it
answers 200 or the load timeout passes.  Stopping an instance cancels its
scope: ``run_process`` then delivers SIGTERM (SIGKILL to one still loading)
and SIGKILL after the grace period.  Nothing outlives the nursery.

Requests hold a *lease* on the instance that serves them (``acquire`` …
``release``, until the response's last byte): a leased instance is busy.  A
model that is not running is loaded through one FIFO queue of tickets, as
llama-server's router schedules them: the ticket at its head starts its load
when fewer than ``--models-max`` models run, else it unloads the least
recently used *idle* model (loaded, no lease) and starts once that one has
exited, else it waits, and every ticket behind it waits too.  A ticket is
granted with its lease already taken, so a model just loaded for a request is
never given up before that request reaches it; tickets for a model that is
already loading are granted at once (several requests for one model cost one
eviction); a client that leaves takes its ticket with it, so nothing is
unloaded for nobody.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs
import httpx
import trio

from bubo.errors import InvalidRequest, ServiceUnavailable

from .catalog import CatalogEntry
from .command import CHILD_HOST, child_command, child_environment
from .registry import Instance, ModelRecord, Registry, exit_code_of

__all__ = ["ChildCommand", "Supervisor", "SupervisorConfig"]

logger = logging.getLogger(__name__)

READY_POLL_S = 0.2  # between two /ready probes of a loading child
READY_PROBE_TIMEOUT_S = 5.0  # one probe
# After SIGTERM a child drains for its own --shutdown-timeout, interrupts what still runs (up to 10 s)
# and flushes (2 s); past this margin on top of that it gets SIGKILL.
STOP_MARGIN_S = 15.0


ChildCommand = Callable[[CatalogEntry, int, Sequence[str], Sequence[str]], tuple[str, ...]]
"""A child's command line from (model, port, inherited flags, extra args): ``child_command`` unless a test
injects another."""


@attrs.frozen(kw_only=True)
class SupervisorConfig:
    """How children are started and stopped."""

    inherited: tuple[str, ...] = ()  # the router's flags each child repeats
    environ: Mapping[str, str] = attrs.field(factory=lambda: dict(os.environ))
    child_key: str = attrs.field(repr=False)  # the key children require (the router sends it)
    models_max: int = 4  # 0: no limit
    load_timeout_s: float = 600.0
    stop_grace_s: float = 30.0 + STOP_MARGIN_S
    command: ChildCommand = child_command


class Supervisor:
    """Loads, watches and stops the children of one router app."""

    def __init__(self, registry: Registry, client: httpx.AsyncClient, config: SupervisorConfig) -> None:
        self.registry = registry
        self._client = client
        self._config = config
        self._nursery: trio.Nursery | None = None
        self._queue: list[_Ticket] = []  # loads waiting for room under --models-max, first come first
        self._closed = False

    @property
    def child_headers(self) -> dict[str, str]:
        """What the router sends a child to be let in."""
        return {"Authorization": f"Bearer {self._config.child_key}"}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the children's nursery until :meth:`aclose` (start with ``nursery.start``)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def aclose(self) -> None:
        """Stop every child (SIGTERM, then SIGKILL after the grace period) and wait until all are gone."""
        self._closed = True
        for ticket in self._queue:  # their requests get 503 not_ready
            ticket.granted.set()
        self._queue.clear()
        running = [r.instance for r in self.registry.running() if r.instance is not None]
        for instance in running:
            instance.request_stop()
        for instance in running:
            await instance.exited.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def queued(self, record: ModelRecord) -> bool:
        """Whether a load of *record* waits in the queue."""
        return any(ticket.record is record for ticket in self._queue)

    async def acquire(self, record: ModelRecord, *, autoload: bool) -> Instance:
        """The model's loaded instance with a lease on it, loading it first when *autoload* allows.

        The caller must :meth:`release` the instance once its response has ended.

        Raises:
            InvalidRequest: not loaded and autoload is off (``model_not_loaded``).
            ServiceUnavailable: the model failed to load (``model_failed``), or the router stops.

        """
        while True:
            self._check_open()
            instance = record.instance
            if instance is not None and instance.stopping:  # being unloaded: wait until gone, then load
                await instance.exited.wait()
                continue
            if instance is not None:
                instance.in_flight += 1
            elif not autoload:
                raise InvalidRequest(
                    f"model {record.name!r} is not loaded: load it with POST /models/load, or "
                    "ask with ?autoload=true",
                    code="model_not_loaded",
                    param="model",
                )
            else:
                instance = await self._queued_load(record)
            if await self._settled(instance):
                return instance
            # unloaded while it loaded: try again

    def release(self, instance: Instance) -> None:
        """A request's response has ended: its lease on *instance* is given back."""
        instance.in_flight -= 1
        self._schedule()

    def request_load(self, record: ModelRecord, extra: Sequence[str] = ()) -> None:
        """Queue a load of *record* with *extra* flags, for no request in particular (``/models/load``)."""
        self._check_open()
        self._queue.append(_Ticket(record=record, extra=tuple(extra), lease=False))
        self._schedule()

    async def _queued_load(self, record: ModelRecord) -> Instance:
        """Wait in the queue for *record*'s instance; it comes with the lease taken."""
        ticket = _Ticket(record=record)
        self._queue.append(ticket)
        self._schedule()
        try:
            await ticket.granted.wait()
        except BaseException:  # the client left (or the router stops): nothing is loaded for it
            if ticket in self._queue:
                self._queue.remove(ticket)
                self._schedule()
            elif ticket.instance is not None:
                self.release(ticket.instance)
            raise
        if ticket.instance is None:
            self._check_open()
            raise ServiceUnavailable("the server is shutting down", code="not_ready")
        return ticket.instance

    async def _settled(self, instance: Instance) -> bool:
        """Wait, leasing *instance*, until it is loaded (True) or has ended (False: the lease given back).

        Raises:
            ServiceUnavailable: it failed (``model_failed``).

        """
        try:
            await instance.settled.wait()
        except BaseException:
            self.release(instance)
            raise
        if instance.loaded and not instance.stopping:
            return True
        self.release(instance)
        if instance.failed:
            raise self.failure(instance)
        return False

    def _schedule(self) -> None:
        """Serve the queue from its head: load, make room, or wait for a change (a lease, an exit)."""
        limit = self._config.models_max
        while self._queue and not self._closed:
            ticket = self._queue[0]
            record = ticket.record
            instance = record.instance
            if instance is not None and instance.stopping:
                return  # its exit calls this again
            if instance is None:
                running = self.registry.running()
                if limit > 0 and len(running) >= limit:
                    self._make_room(record, running)
                    return
                instance = self._spawn(record, ticket.extra)
            self._queue.pop(0)
            ticket.instance = instance
            if ticket.lease:
                instance.in_flight += 1
            ticket.granted.set()

    def _make_room(self, record: ModelRecord, running: list[ModelRecord]) -> None:
        """Unload the least recently used idle model, unless one is on its way out already."""
        if any(r.instance is not None and r.instance.stopping for r in running):
            return  # its exit makes the room
        idle = [
            r
            for r in running
            if r is not record and r.instance is not None and r.instance.loaded and r.instance.in_flight == 0
        ]
        victim = min(idle, key=lambda r: r.last_used, default=None)
        if victim is not None and victim.instance is not None:
            logger.info(
                "--models-max %d reached: unloading %s (idle, least recently used) for %s",
                self._config.models_max,
                victim.name,
                record.name,
            )
            victim.instance.request_stop()

    def _spawn(self, record: ModelRecord, extra: Sequence[str]) -> Instance:
        """Start a child for *record* now."""
        assert self._nursery is not None  # run() started before serving
        listener = _listening_socket()
        port: int = listener.getsockname()[1]
        instance = Instance(
            model=record.name,
            port=port,
            args=self._config.command(record.entry, port, self._config.inherited, extra),
            stop_timeout=record.entry.stop_timeout,
        )
        record.start(instance, trio.current_time())
        self._nursery.start_soon(self._supervise, record, instance, listener)
        logger.info("loading model %s on port %d", record.name, port)
        return instance

    def unload(self, record: ModelRecord) -> None:
        """Ask the model's child to stop; it drains its running requests first."""
        if record.instance is not None:
            logger.info("unloading model %s", record.name)
            record.instance.request_stop()

    def failure(self, instance: Instance) -> ServiceUnavailable:
        """The 503 for requests to an *instance* that failed."""
        if instance.load_timed_out:
            why = f"did not become ready within {self._config.load_timeout_s:g} s (--models-load-timeout)"
        elif instance.spawn_failed:
            why = "could not be started"
        else:
            why = f"exited with status {instance.exit_code}"
        return ServiceUnavailable(
            f"model {instance.model!r} failed: its process {why}; the next request loads it again",
            code="model_failed",
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ServiceUnavailable("the server is shutting down", code="not_ready")

    async def _supervise(self, record: ModelRecord, instance: Instance, listener: socket.socket) -> None:
        """Run *instance*'s process on *listener* until it exits or is stopped; record how it ended.

        The child gets *listener* open (``child.py``); the router's copy is closed only once the
        process has been reaped, so its port stays taken while the router may still send to it.
        """
        environ = child_environment(self._config.environ, self._config.child_key, listener.fileno())
        process: trio.Process | None = None
        try:
            with instance.scope:
                async with trio.open_nursery() as nursery:

                    async def child(*, task_status: trio.TaskStatus[trio.Process]) -> None:
                        await trio.run_process(
                            list(instance.args),
                            env=environ,
                            stdin=subprocess.PIPE,  # held open while the router lives (child.py)
                            # Its own session: a Ctrl-C at the terminal (the process group's SIGINT)
                            # is the router's, whose drain then signals each child once.
                            start_new_session=True,
                            pass_fds=(listener.fileno(),),  # its listening socket, at the same number
                            check=False,
                            deliver_cancel=partial(self._stop_process, instance),
                            task_status=task_status,
                        )
                        nursery.cancel_scope.cancel()  # it exited on its own: stop probing

                    try:
                        process = await nursery.start(child)
                    except OSError:
                        logger.exception("could not start the process of model %s", record.name)
                        instance.spawn_failed = True
                    else:
                        instance.pid = process.pid
                        nursery.start_soon(self._watch_ready, instance)
        finally:  # also when the app's nursery is cancelled: run_process has reaped the process by now
            listener.close()
            self._finish(record, instance, process)

    def _finish(self, record: ModelRecord, instance: Instance, process: trio.Process | None) -> None:
        if process is not None and isinstance(process.stdin, trio.lowlevel.FdStream):
            process.stdin.close()  # the pipe the child watched
        returncode = process.returncode if process is not None else None
        exit_code = exit_code_of(returncode) if returncode is not None else -1
        instance.mark_exited(exit_code)
        record.finish(instance)
        self.registry.forget(instance)
        self._schedule()
        if instance.failed:
            logger.error("model %s failed: %s", record.name, self.failure(instance).message)
        else:
            logger.info("model %s unloaded (exit status %d)", record.name, exit_code)

    async def _stop_process(self, instance: Instance, process: trio.Process) -> None:
        """SIGTERM (the child drains), SIGKILL after the grace period; SIGKILL at once while loading.

        The grace period is the model's preset ``stop-timeout`` when it has one.
        """
        if instance.loaded:
            grace = self._config.stop_grace_s if instance.stop_timeout is None else instance.stop_timeout
            process.terminate()
            await trio.sleep(grace)
            logger.warning("model %s did not stop within %.0f s: SIGKILL", instance.model, grace)
        process.kill()

    async def _watch_ready(self, instance: Instance) -> None:
        """Poll the child's ``/ready`` until 200, then take its ``/v1/models`` entry; stop it if too slow."""
        with trio.move_on_after(self._config.load_timeout_s):
            while not await self._probe(instance):  # noqa: ASYNC110 - another process: HTTP is the signal
                await trio.sleep(READY_POLL_S)
            instance.mark_loaded(await self._model_info(instance))
            logger.info("model %s is loaded (pid %s, port %d)", instance.model, instance.pid, instance.port)
            return
        instance.load_timed_out = True
        instance.scope.cancel()

    async def _probe(self, instance: Instance) -> bool:
        try:
            response = await self._client.get(
                f"{instance.base_url}/ready", headers=self.child_headers, timeout=READY_PROBE_TIMEOUT_S
            )
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def _model_info(self, instance: Instance) -> dict[str, Any]:
        """The child's first ``/v1/models`` entry (context length and such), or nothing."""
        try:
            response = await self._client.get(
                f"{instance.base_url}/v1/models", headers=self.child_headers, timeout=READY_PROBE_TIMEOUT_S
            )
            data = response.json()["data"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return {}
        return dict(data) if isinstance(data, dict) else {}


@attrs.define(eq=False, kw_only=True)
class _Ticket:
    """A load waiting in the queue: for a request (granted with its lease) or for ``/models/load``."""

    record: ModelRecord
    extra: tuple[str, ...] = ()
    lease: bool = True
    instance: Instance | None = None  # set when granted; None when the router stopped first
    granted: trio.Event = attrs.field(factory=trio.Event)


def _listening_socket() -> socket.socket:
    """A loopback socket on a port the kernel picks, listening: the child serves on it (``child.py``)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As Hypercorn sets it on every socket it serves (the child's included): connections of a dead
        # child left closing do not hold the port; while this one listens, nobody else can bind it.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((CHILD_HOST, 0))
        listener.listen()
    except OSError:
        listener.close()
        raise
    return listener
