"""Sleeping while idle through a real server: ``--sleep-idle-seconds`` over httpx, ``keep_alive`` with the
official ``ollama`` Python client.  The model's memory is read from the process itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

from .conftest import Server, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

MODEL = "smollm2-135m-instruct-q4-1"


@pytest.fixture(name="sleepy", scope="module")
def _sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("sleep") / "bubo.log"
    with serving(log, "-c", "1024", "-np", "1", "--sleep-idle-seconds", "1") as server:
        yield server


def rss_mib(server: Server) -> float:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def until_sleeping(http: httpx.Client, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        props = http.get("/props").json()
        if props["is_sleeping"]:
            return props
        time.sleep(0.1)
    raise AssertionError("the idle model did not sleep")


def test_the_idle_model_is_freed_and_the_next_request_loads_it(sleepy: Server) -> None:
    with httpx.Client(base_url=sleepy.base_url, timeout=120) as http:
        answer = http.post(
            "/completion", json={"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}
        )
        assert answer.status_code == 200
        awake_mib = rss_mib(sleepy)
        until_sleeping(http)  # true from the moment it begins to free the model
        deadline = time.monotonic() + 30
        while awake_mib - rss_mib(sleepy) < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert awake_mib - rss_mib(sleepy) >= 50  # the weights (about 90 MiB) and the KV cache went
        assert http.get("/health").json() == {"status": "ok", "is_sleeping": True}
        slots = http.get("/slots").json()
        assert slots[0]["is_sleeping"] is True
        metrics = http.get("/metrics")
        assert metrics.status_code == 200
        assert "llamacpp:prompt_tokens_total" in metrics.text
        assert http.get("/props").json()["is_sleeping"] is True  # none of the status routes woke it

        again = http.post(
            "/completion", json={"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}
        )
        assert again.status_code == 200
        assert again.json()["content"] == answer.json()["content"]
        assert again.json()["timings"]["cache_n"] == 0  # the prompt cache went with the model
        assert http.get("/props").json()["is_sleeping"] is False or until_sleeping(http)


def test_ollama_keep_alive_unloads_and_ps_says_so(sleepy: Server) -> None:
    with ollama.Client(host=sleepy.base_url, timeout=120) as client:
        loaded = client.generate(model=MODEL, prompt="Hi", options={"num_predict": 2}, keep_alive="10m")
        assert loaded.done
        running = client.ps().models
        assert [m.model for m in running][:1] == [f"{MODEL}:latest"]
        left = running[0].expires_at.timestamp() - time.time()
        assert 500 < left <= 600  # keep_alive 10m overrides --sleep-idle-seconds 1
        # (that the sleeper acts on this deadline and no other: tests/service/test_idle.py, on trio's clock)

        unloaded = client.generate(model=MODEL, prompt="", keep_alive=0)
        assert unloaded.done_reason == "unload"
        assert client.ps().models == []
        with httpx.Client(base_url=sleepy.base_url, timeout=30) as http:
            assert http.get("/props").json()["is_sleeping"] is True

        answer = client.chat(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], options={"num_predict": 3}
        )
        assert answer.message.content
        assert client.ps().models  # loaded again, for the server's own timeout now (no keep_alive)
