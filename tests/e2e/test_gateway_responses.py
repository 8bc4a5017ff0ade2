"""``previous_response_id`` through the real smg in front of two ``bubo serve`` replicas (docs/deploy.md).

Each replica keeps its own Responses store.  smg in its regular mode forwards
``POST /v1/responses`` as it is, to the replica its policy picks for the new
input's text, so a continuation may reach a replica that never saw the id:
Bubo then answers 404 ``response_not_found`` naming itself and the way on (the
earlier turns as input items).  smg with ``--backend openai`` keeps the
responses itself (``--history-backend memory``): in front of the ``cache_aware``
gateway it expands ``previous_response_id`` into the whole conversation, which
the inner gateway routes by prefix, so a chain of turns works and reads its
prefix from one replica's cache.  Every process is started and stopped by PID.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import httpx
import openai
import pytest

from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

# The first turn is long, as an agent's is: each later turn then starts with most of the text the gateway
# has already sent to one replica (cache_aware picks a replica when 30 % of a request's text matches).
NOTES = " ".join(f"Note {i}: the {i}th colour on the list is worth remembering." for i in range(30))
TURNS = (f"{NOTES} Name a colour.", "Name another one.", "And a third?")
HEALTH = ["--health-check-endpoint", "/ready", "--health-check-interval-secs", "2",
          "--health-failure-threshold", "2", "--health-success-threshold", "1",
          "--worker-startup-check-interval", "1"]  # fmt: skip


def smg_command() -> str:
    """The installed `smg` (next to this interpreter): the gateway these tests are about."""
    found = shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
    assert Path(found).exists(), "smg (pip install smg==1.13.0) is needed: the tests run the real gateway"
    return found


@attrs.frozen
class Gateway:
    process: subprocess.Popen[bytes]
    base_url: str
    log: Path


def serves_a_model(base_url: str) -> bool:
    """Whether smg lists a model: it is ready before it has registered its workers."""
    try:
        response = httpx.get(base_url + "/v1/models", timeout=2)
    except httpx.TransportError:
        return False
    return response.status_code == 200 and bool(response.json().get("data"))


def answers_readiness(base_url: str) -> bool:
    try:
        return httpx.get(base_url + "/readiness", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def start_gateway(log: Path, *args: str, ready: Callable[[str], bool] = serves_a_model) -> Gateway:
    """`smg launch` on a free loopback port; waits (at most 120 s) until *ready* says so."""
    port = free_port()
    command = [smg_command(), "launch", "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *args]  # fmt: skip
    with log.open("wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    gateway = Gateway(process=process, base_url=f"http://127.0.0.1:{port}", log=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"smg exited with {process.returncode}:\n{log.read_text(errors='replace')}")
        if ready(gateway.base_url):
            return gateway
        time.sleep(0.2)
    stop_gateway(gateway)
    raise RuntimeError(f"smg not ready within 120 s:\n{log.read_text(errors='replace')}")


def stop_gateway(gateway: Gateway) -> None:
    if gateway.process.poll() is None:
        gateway.process.terminate()
        try:
            gateway.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait(timeout=10)


@attrs.frozen
class Fleet:
    model: str  # the replicas' model id: the name smg registers them under
    replicas: tuple[Server, ...]
    inner: Gateway  # cache_aware over the replicas
    outer: Gateway  # --backend openai with its own history, over `inner`


@pytest.fixture(name="fleet", scope="module")
def _fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("gateway")
    replicas: list[Server] = []
    gateways: list[Gateway] = []
    try:
        for index in range(2):
            port = free_port()
            command = [bubo_command(), "serve", "--port", str(port), "-t", "1"]
            replicas.append(start_server(command, port, logs / f"bubo{index}.log", env={"BUBO_THREADS": "1"}))
        urls = [server.base_url for server in replicas]
        gateways.append(
            start_gateway(logs / "inner.log", "--policy", "cache_aware", "--worker-urls", *urls, *HEALTH)
        )
        gateways.append(
            start_gateway(
                logs / "outer.log",
                "--backend",
                "openai",
                "--history-backend",
                "memory",
                "--worker-urls",
                gateways[0].base_url,
                # it asks its worker for the model list on the first request that names one
                ready=answers_readiness,
            )
        )
        model = httpx.get(urls[0] + "/v1/models", timeout=10).json()["data"][0]["id"]  # its id, then aliases
        yield Fleet(model=model, replicas=tuple(replicas), inner=gateways[0], outer=gateways[1])
    finally:
        for gateway in reversed(gateways):
            stop_gateway(gateway)
        for server in replicas:
            stop_server(server)


def test_a_chain_of_three_turns_through_smg_s_own_store_reads_its_prefix_from_cache(fleet: Fleet) -> None:
    with openai.OpenAI(
        base_url=fleet.outer.base_url + "/v1", api_key="unused", max_retries=0, timeout=300
    ) as client:
        previous: str | None = None
        cached = []
        for text in TURNS:
            response = client.responses.create(
                model=fleet.model, input=text, max_output_tokens=8, previous_response_id=previous
            )
            assert response.output_text  # an answer (cut at max_output_tokens: "incomplete")
            assert response.usage is not None
            cached.append(response.usage.input_tokens_details.cached_tokens)
            previous = response.id
        fetched = client.responses.retrieve(previous)
    assert fetched.id == previous
    assert cached[0] == 0
    assert all(tokens > 0 for tokens in cached[1:]), cached  # turns 2 and 3 found their prefix


WORDS = ("apple", "river", "engine", "violet", "granite", "kettle", "orbit", "meadow", "cipher", "lantern",
         "tundra", "pepper", "harbor", "quartz", "saddle", "falcon", "ribbon", "walnut", "marble", "thistle")  # fmt: skip


def test_through_the_plain_gateway_a_continuation_reaches_any_replica_and_a_miss_says_so(
    fleet: Fleet,
) -> None:
    """smg's regular mode forwards previous_response_id as it is, routed by the new input's text alone.

    Short turns with nothing in common: a continuation lands on either replica, and on the one that
    did not answer before Bubo's 404 names itself and the way on; the earlier turns as items then work.
    """
    rng = random.Random(7)
    outcomes = []
    with httpx.Client(base_url=fleet.inner.base_url, timeout=300) as client:
        for _conversation in range(6):
            turns = [f"{' '.join(rng.sample(WORDS, 4))}? Answer with one of these words." for _ in range(3)]
            first = client.post(
                "/v1/responses", json={"model": fleet.model, "input": turns[0], "max_output_tokens": 8}
            )
            assert first.status_code == 200
            previous = first.json()
            items: list[object] = [{"role": "user", "content": turns[0]}, *previous["output"]]
            for text in turns[1:]:
                body = {
                    "model": fleet.model,
                    "input": text,
                    "max_output_tokens": 8,
                    "previous_response_id": previous["id"],
                }
                answer = client.post("/v1/responses", json=body)
                outcomes.append(answer.status_code)
                items.append({"role": "user", "content": text})
                if answer.status_code != 200:
                    error = answer.json()["error"]
                    assert (answer.status_code, error["code"]) == (404, "response_not_found"), answer.text
                    assert "not stored on this server" in error["message"]
                    assert error["message"].endswith("send the earlier turns as input items instead")
                    answer = client.post(
                        "/v1/responses", json={"model": fleet.model, "max_output_tokens": 8, "input": items}
                    )
                    assert answer.status_code == 200, answer.text
                previous = answer.json()
                items.extend(previous["output"])
    assert set(outcomes) == {200, 404}  # both happen: the store is per replica
