"""Three `bubo serve` replicas of the default model behind the real Shepherd Model Gateway, all on 127.0.0.1.

The replicas (one thread each, a 4,096-token context shared by two slots) start
once for each test module and are stopped by PID after it, so that no idle
replica outlives the module's tests in a long run; a test that kills or stops
one starts it again on the same port before it returns, so the next test finds
three.  Each test starts its own gateway (``smg launch``, the policy and
flags it measures) by PID and stops it by PID.  smg is the `smg` package
(``nox -s tests`` and ``nox -s gateway`` install the pinned version): it is found
next to this interpreter, else on PATH; a missing smg fails the run, it never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from tests.e2e.conftest import Server, bubo_command, free_port, start_server, stop_server
from tests.gateway import _metrics

REPLICAS = 3
CONTEXT = 4096  # a 1,500-token system prompt, four turns, two sessions at once per replica
SLOTS = 2
# Three health checks' time: smg has seen /ready's 503 before the replica refuses work (docs/operations.md).
DRAIN_DELAY = 3
# The gateway polls each replica's /ready every second and needs one answer to change its mind: a replica
# that drains (/ready 503) or died leaves the rotation within a second or two, and one that came back
# re-enters as fast.  smg's defaults (60 s, three failures, two successes) suit a fleet of big GPUs.
HEALTH_FLAGS = (
    "--health-check-endpoint", "/ready",
    "--health-check-interval-secs", "1",
    "--health-failure-threshold", "1",
    "--health-success-threshold", "1",
)  # fmt: skip
# cache_aware keeps a session on the replica that holds its prefix until that replica runs more requests
# than the fleet's mean by both thresholds, then sends it to the least loaded one.  smg's defaults (64
# requests and 1.5 times the mean) are sized for GPU servers that batch hundreds of requests: with two
# slots a replica, four clients all stayed on the replica that first read the shared system prompt
# (measured: 42/0/0 requests), and with one request above the mean allowed, on two of three (0/21/21).
CACHE_AWARE_FLAGS = ("--balance-abs-threshold", "0", "--balance-rel-threshold", "1.2")
ROOT = Path(__file__).resolve().parents[2]


def smg_binary() -> str:
    """The `smg` console script: beside this interpreter (a venv's bin), else on PATH."""
    beside = Path(sys.executable).with_name("smg")
    if beside.exists():
        return str(beside)
    found = shutil.which("smg")
    if found is None:
        pytest.fail("smg is not installed (`nox -s tests` and `nox -s gateway` install smg==1.13.0)")
    return found


def results_directory() -> Path:
    """test-artifacts/gateway/ (or $BUBO_TEST_ARTIFACTS/gateway/): the measured numbers, as JSON."""
    folder = Path(os.environ.get("BUBO_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "gateway"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_result(name: str, result: Any) -> Path:
    """*result* as test-artifacts/gateway/<name>.json."""
    path = results_directory() / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return path


@attrs.define
class Fleet:
    """The replicas, each on a port of its own that survives a restart."""

    directory: Path
    ports: list[int]
    replicas: list[Server] = attrs.field(factory=list)
    starts: int = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def command(self, port: int) -> list[str]:
        """`bubo serve` on *port*; on SIGTERM /ready is 503 for DRAIN_DELAY s while it still serves."""
        return [
            bubo_command(), "serve", "--port", str(port), "--threads", "1",
            "-c", str(CONTEXT), "-np", str(SLOTS), "--cache-ram", "256",
            "--drain-delay", str(DRAIN_DELAY), "--shutdown-timeout", "60",
        ]  # fmt: skip

    def start(self, index: int) -> Server:
        """Start replica *index* on its port; wait (bounded) until its /ready is 200."""
        self.starts += 1
        port = self.ports[index]
        log = self.directory / f"replica-{index}-{self.starts}.log"
        return start_server(self.command(port), port, log, {"BUBO_THREADS": "1"})

    def restart(self, index: int) -> None:
        """Replica *index* again, after it was killed or stopped (its old process is reaped first)."""
        stop_server(self.replicas[index])  # reaps it (a process already gone is only waited for)
        self.replicas[index] = self.start(index)

    def scrapes(self) -> list[_metrics.Scrape]:
        """Each replica's /metrics, in order."""
        return [_metrics.scrape(f"{url}/metrics") for url in self.urls]

    def stop(self) -> None:
        """SIGTERM every replica at once (each drains for DRAIN_DELAY s), then reap each by PID."""
        running = [replica.process for replica in self.replicas if replica.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture(name="fleet", scope="module")
def _fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(directory=tmp_path_factory.mktemp("fleet"), ports=[free_port() for _ in range(REPLICAS)])
    try:
        for index in range(REPLICAS):
            fleet.replicas.append(fleet.start(index))
        yield fleet
    finally:
        fleet.stop()


@attrs.define
class Gateway:
    """A running `smg launch` in front of the fleet."""

    process: subprocess.Popen[bytes]
    url: str
    metrics_url: str
    log: Path
    model: str = ""  # the model id smg registered from the workers: requests must name it

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def scrape(self) -> _metrics.Scrape:
        return _metrics.scrape(self.metrics_url)


def gateway_command(
    urls: Sequence[str], policy: str, port: int, metrics_port: int, flags: Sequence[str] = ()
) -> list[str]:
    """`smg launch` on 127.0.0.1:*port* (metrics on 127.0.0.1:*metrics_port*) over *urls*."""
    return [
        smg_binary(), "launch", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *urls, "--policy", policy, *(CACHE_AWARE_FLAGS if policy == "cache_aware" else ()),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-startup-timeout-secs", "120", "--worker-startup-check-interval", "1",
        *HEALTH_FLAGS, *flags,
    ]  # fmt: skip


def start_gateway(fleet: Fleet, policy: str, log: Path, flags: Sequence[str] = ()) -> Gateway:
    """smg with *policy* over the fleet; wait (at most 120 s) until it lists the model and counts."""
    port, metrics_port = free_port(), free_port()
    command = gateway_command(fleet.urls, policy, port, metrics_port, flags)
    with log.open("wb") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    gateway = Gateway(
        process=process,
        url=f"http://127.0.0.1:{port}",
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        log=log,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"smg exited with {process.returncode}:\n{gateway.output()}")
        with contextlib.suppress(httpx.TransportError):
            models = httpx.get(f"{gateway.url}/v1/models", timeout=2)
            metrics = httpx.get(gateway.metrics_url, timeout=2)
            if models.status_code == 200 and models.json().get("data") and metrics.status_code == 200:
                gateway.model = models.json()["data"][0]["id"]
                return gateway
        time.sleep(0.2)
    stop_gateway(gateway)
    raise RuntimeError(f"smg not serving within 120 s:\n{gateway.output()}")


def stop_gateway(gateway: Gateway) -> None:
    """SIGTERM, SIGKILL after 20 s (smg waits for in-flight requests; none are left when a test ends)."""
    if gateway.process.poll() is None:
        gateway.process.send_signal(signal.SIGTERM)
        try:
            gateway.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait(timeout=10)


@contextlib.contextmanager
def gateway(fleet: Fleet, policy: str, directory: Path, flags: Sequence[str] = ()) -> Iterator[Gateway]:
    """A gateway for the length of a ``with`` block."""
    running = start_gateway(fleet, policy, directory / f"smg-{policy}.log", flags)
    try:
        yield running
    finally:
        stop_gateway(running)
