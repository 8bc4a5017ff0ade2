"""A real Hypercorn server process on 127.0.0.1 with the real default model.

Started by PID, stopped by PID (SIGTERM, then SIGKILL after a deadline);
bounded waits everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import anthropic
import attrs
import httpx
import openai
import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define
class Server:
    """A running server process."""

    process: subprocess.Popen[bytes]
    base_url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(
    command: Sequence[str],
    port: int,
    log: Path,
    env: dict[str, str] | None = None,
    api_key: str | None = None,
) -> Server:
    """Start *command*, wait (at most 120 s) until /ready answers 200."""
    environment = {**os.environ, "BUBO_CTX_SIZE": "2048", "BUBO_THREADS": "2", **(env or {})}
    with log.open("wb") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=environment)
    server = Server(process=process, base_url=f"http://127.0.0.1:{port}", log=log)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{server.base_url}/ready", headers=headers, timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"server not ready within 120 s:\n{server.output()}")


def stop_server(server: Server) -> int:
    """SIGTERM the process, SIGKILL after 20 s; return its exit status."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)
    return server.process.returncode


@contextlib.contextmanager
def serving(
    log: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    api_key: str | None = None,
    command: Callable[[int], list[str]] | None = None,
    clean_exit: bool = True,
) -> Iterator[Server]:
    """`bubo serve --port P *flags` on a free port, writing *log*, ready within the block and stopped after it.

    *command*: another server for the port instead (:func:`hypercorn_command`, :func:`harness_command`),
    configured by *env*'s BUBO_* variables alone (no *flags*).  *clean_exit*: the server must exit
    with 0 when SIGTERM stops it (a drain that fails or hangs fails the test using it).
    """
    assert not (command and flags), "another command takes its settings from BUBO_* variables"
    port = free_port()
    argv = command(port) if command else [bubo_command(), "serve", "--port", str(port), *flags]
    server = start_server(argv, port, log, env=env, api_key=api_key)
    try:
        yield server
    finally:
        status = stop_server(server)
    if clean_exit:
        assert status == 0, server.output()


def openai_client(server: Server, *, timeout: float = 120) -> openai.OpenAI:
    """The official OpenAI SDK pointed at *server*; close it (``with``): a leaked socket fails a later test."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=timeout)


def anthropic_client(server: Server, *, timeout: float = 120) -> anthropic.Anthropic:
    """The official Anthropic SDK pointed at *server*; close it as well."""
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=timeout)


@pytest.fixture(name="sdk")
def _sdk() -> Iterator[contextlib.ExitStack]:
    """Clients a test makes (``sdk.enter_context(openai_client(server))``), closed after it."""
    with contextlib.ExitStack() as stack:
        yield stack


def bubo_command() -> str:
    """The installed `bubo` console script (next to this interpreter)."""
    return shutil.which("bubo") or str(Path(sys.executable).with_name("bubo"))


def hypercorn_command(port: int) -> list[str]:
    """`hypercorn bubo.app:app --worker-class trio` on 127.0.0.1:*port* (settings come from BUBO_*)."""
    return [
        sys.executable,
        "-m",
        "hypercorn",
        "bubo.app:app",
        "--worker-class",
        "trio",
        "--bind",
        f"127.0.0.1:{port}",
    ]


HARNESS = Path(__file__).with_name("harness_server.py")


def harness_command(control: Path) -> Callable[[int], list[str]]:
    """harness_server.py (the real app, with test switches read from files in *control*) on a port."""
    return lambda port: [sys.executable, str(HARNESS), "--port", str(port), "--control", str(control)]


NODE_PROJECT = Path(__file__).parent / "node"
NODE_CACHE = Path(os.environ.get("BUBO_TEST_NODE", Path.home() / ".cache" / "bubo-test-node"))


@pytest.fixture(name="node_modules", scope="session")
def _node_modules() -> Path:
    """The JavaScript clients of tests/e2e/node (ollama-js, the openai SDK), installed once with `npm ci`."""
    npm = shutil.which("npm")
    assert npm is not None, "npm is needed (Debian's npm package): the JavaScript clients run under node"
    lock = (NODE_PROJECT / "package-lock.json").read_bytes()
    target = NODE_CACHE / f"lock-{hashlib.sha256(lock).hexdigest()[:16]}"
    if not (target / "node_modules" / ".package-lock.json").exists():
        target.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(NODE_PROJECT / name, target / name)
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=target, check=True, timeout=300, capture_output=True,
        )  # fmt: skip
    return target / "node_modules"


@pytest.fixture(name="server", scope="session")
def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`hypercorn bubo.app:app --worker-class trio`, configured by BUBO_* variables."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "hypercorn.log"
    server = start_server(hypercorn_command(port), port, log)
    yield server
    stop_server(server)


@pytest.fixture(name="http")
def _http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client
