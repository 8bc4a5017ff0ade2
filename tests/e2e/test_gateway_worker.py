"""One real `bubo serve` behind the real Shepherd Model Gateway (`smg`): what the gateway registers and weighs.

smg registers the worker from its ``/server_info``, ``/model_info`` and ``/v1/models`` (the model id
it routes by, the context, the slots) and polls its load from ``/v1/loads``; its own ``/workers``
and ``/get_loads`` show what it took.  Everything listens on 127.0.0.1; both processes are started
and stopped by PID, every wait is bounded.  A missing `smg` fails the test: it is a test dependency.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

MODEL_ID = "gateway-smollm"  # the served id (--alias' first name); "small" is another name for it
SLOTS = 2
WAIT_S = 60.0  # the longest any condition below is waited for


@attrs.frozen
class Gateway:
    base_url: str
    log: Path


def smg_command() -> str:
    """The `smg` console script of this environment (the tests dependency group), else on PATH."""
    beside = Path(sys.executable).with_name("smg")
    found = str(beside) if beside.exists() else shutil.which("smg")
    if found is None:
        pytest.fail("smg is not installed: it is in the tests dependency group (pyproject.toml)")
    return found


def wait_until(
    condition: Callable[[], Any], what: str, process: subprocess.Popen[bytes] | None = None
) -> Any:
    """Poll *condition* until it returns something true (that value), for at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} before {what}")
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {WAIT_S:g} s: {what}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def running_gateway(worker: Server, log: Path) -> Iterator[Gateway]:
    """`smg launch` in front of *worker*, with a load-aware policy (least_load: power_of_two needs two workers).

    Its load monitor polls every second, it takes the worker in once ``/ready`` says so, maps the
    alias ``small`` to the served id, logs at debug, keeps its metrics on loopback and reads no tokenizer.
    """
    port = free_port()
    command = [
        smg_command(), "launch",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", worker.base_url,
        "--policy", "least_load",
        "--load-monitor-interval", "1",
        "--health-check-endpoint", "/ready",
        "--model-alias", f"small={MODEL_ID}",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--disable-tokenizer-autoload",
        "--log-level", "debug",
    ]  # fmt: skip
    with log.open("wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    gateway = Gateway(base_url=f"http://127.0.0.1:{port}", log=log)
    try:
        wait_until(lambda: _answers(f"{gateway.base_url}/health"), f"smg listening on {port}", process)
        yield gateway
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@pytest.fixture(name="worker", scope="module")
def _worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`bubo serve` with two slots and two names."""
    port = free_port()
    log = tmp_path_factory.mktemp("worker") / "bubo.log"
    command = [
        bubo_command(), "serve", "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(SLOTS), "--alias", f"{MODEL_ID},small",
    ]  # fmt: skip
    server = start_server(command, port, log)
    yield server
    stop_server(server)


@pytest.fixture(name="gateway", scope="module")
def _gateway(worker: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(worker, tmp_path_factory.mktemp("gateway") / "smg.log") as gateway:
        yield gateway


def registered(gateway: Gateway) -> dict[str, Any] | None:
    """The gateway's record of its one worker, once it has registered it."""
    workers = httpx.get(f"{gateway.base_url}/workers", timeout=5).json().get("workers", [])
    return workers[0] if len(workers) == 1 and workers[0].get("status") == "ready" else None


def gateway_load(gateway: Gateway) -> dict[str, Any]:
    """What the gateway reads of its worker's load now (its ``/get_loads`` asks the worker then)."""
    [load] = httpx.get(f"{gateway.base_url}/get_loads", timeout=10).json()["loads"]
    return load


def worker_gauges(worker: Server) -> dict[str, float]:
    """The worker's unlabelled ``bubo:`` samples in its ``/metrics``."""
    text = httpx.get(f"{worker.base_url}/metrics", timeout=10).text
    samples = (line.split(" ") for line in text.splitlines() if line.startswith("bubo:") and "{" not in line)
    return {name: float(value) for name, value in samples}


def test_the_gateway_registers_the_served_model_and_its_limits(worker: Server, gateway: Gateway) -> None:
    """smg registers the served id with Bubo's context and slots, read from /server_info and /model_info."""
    record = wait_until(
        lambda: (found := registered(gateway)) and "engine_load" in found and found,
        "the worker registered and its load read once",
    )
    assert record["model_id"] == MODEL_ID
    assert record["url"] == worker.base_url
    assert record["runtime_type"] == "sglang"  # what answering /server_info (and not /version) makes it
    [model] = record["models"]
    assert (model["id"], model["context_length"]) == (MODEL_ID, 2048)
    labels = record["labels"]
    assert labels["served_model_name"] == MODEL_ID  # /server_info
    assert labels["max_running_requests"] == str(SLOTS)
    assert labels["max_total_tokens"] == "2048"
    assert labels["is_generation"] == "true"  # /model_info
    assert labels["model_type"] == "llama"
    [rank] = record["engine_load"]["loads"]  # its load monitor's last reading of /v1/loads
    assert (rank["max_running_requests"], rank["max_total_num_tokens"]) == (SLOTS, 2048)
    log = gateway.log.read_text(errors="replace")
    assert "Detected HTTP backend via /server_info" in log
    assert "falling back to deprecated" not in log


def test_requests_by_the_served_id_and_by_a_gateway_alias(gateway: Gateway) -> None:
    """The served id routes as is; Bubo's other names route once the gateway maps them (--model-alias)."""
    wait_until(lambda: registered(gateway), "the worker registered")
    for name in (MODEL_ID, "small"):
        answer = httpx.post(
            f"{gateway.base_url}/v1/chat/completions",
            json={"model": name, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]


def test_the_gateway_reads_the_running_and_waiting_requests(worker: Server, gateway: Gateway) -> None:
    """Three long generations on two slots: the gateway sees two running, one waiting, and their tokens."""
    wait_until(lambda: registered(gateway), "the worker registered")
    wait_until(lambda: gateway_load(gateway)["num_total_reqs"] == 0, "an idle worker")
    idle = gateway_load(gateway)
    assert (idle["num_used_tokens"], idle["num_waiting_uncached_tokens"], idle["token_usage"]) == (0, 0, 0.0)
    answers: list[int] = []

    def generate(topic: str) -> None:
        body = {
            "model": MODEL_ID,
            "messages": [{"role": "user", "content": f"Write a long story about {topic}."}],
            "max_tokens": 200,
            "ignore_eos": True,  # llama-server's field: the generation runs its whole length
        }
        answer = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=300)
        answers.append(answer.status_code)

    threads = [threading.Thread(target=generate, args=(topic,)) for topic in ("owls", "rivers", "kites")]
    for thread in threads:
        thread.start()

    def seen_by_both() -> tuple[dict[str, Any], dict[str, float]] | None:
        load, gauges = gateway_load(gateway), worker_gauges(worker)
        both = load["num_waiting_reqs"] == 1 and gauges["bubo:num_requests_waiting"] == 1
        return (load, gauges) if both else None

    try:
        # the gateway's reading and the worker's own Inference Extension gauges, within one poll
        busy, gauges = wait_until(seen_by_both, "one request waiting, for the gateway and in /metrics")
    finally:
        for thread in threads:
            thread.join(timeout=300)
    assert (busy["num_running_reqs"], busy["num_total_reqs"]) == (SLOTS, SLOTS + 1)
    assert busy["num_used_tokens"] > 0  # the running requests' cells
    assert busy["num_waiting_uncached_tokens"] > 0  # at least the waiting prompt, not read yet
    assert busy["token_usage"] == pytest.approx(busy["num_used_tokens"] / busy["max_total_num_tokens"])
    assert gauges["bubo:num_requests_running"] == SLOTS
    assert gauges["bubo:kv_cache_usage_perc"] > 0
    assert answers == [200, 200, 200]
    after = wait_until(lambda: (load := gateway_load(gateway))["num_total_reqs"] == 0 and load, "idle again")
    assert (after["num_used_tokens"], after["num_waiting_uncached_tokens"]) == (0, 0)
    assert after["gen_throughput"] > 0
    # the finished conversations' prefixes stay cached, yet count as no load
    cached = httpx.get(f"{worker.base_url}/metrics", timeout=5).text
    [tokens] = [line for line in cached.splitlines() if line.startswith("llamacpp:kv_cache_tokens ")]
    assert float(tokens.split(" ")[1]) > 0
