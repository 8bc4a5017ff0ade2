"""Operations end to end: memory guard, device lost and recovery, debug hooks, limits, CORS, logs.

Faults come from outside Bubo: ``harness_server.py`` runs the real server and
model with llama.cpp's decode and the memory probe steerable through files.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest

from .conftest import Server, bubo_command, free_port, harness_command, serving, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

MIB = 1024 * 1024
CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
MESSAGE = {"model": "bubo", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}


@attrs.frozen
class Harness:
    server: Server
    control: Path

    def set_memory(self, *, available_mib: int, limit_mib: int) -> None:
        reading = {"available_bytes": available_mib * MIB, "limit_bytes": limit_mib * MIB}
        (self.control / "memory.json").write_text(json.dumps(reading))

    def switch(self, name: str, *, on: bool) -> None:
        path = self.control / name
        if on:
            path.touch()
        else:
            path.unlink(missing_ok=True)


@pytest.fixture(name="harness", scope="module")
def _harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    control = tmp_path_factory.mktemp("harness-control")
    log = tmp_path_factory.mktemp("harness") / "harness.log"
    env = {"BUBO_DEVICE_RECOVERY": "on", "BUBO_MEMORY_LOW_WATER_MIB": "16", "BUBO_CTX_SIZE": "1024"}
    with serving(log, env=env, command=harness_command(control)) as server:
        yield Harness(server=server, control=control)


class TestMemoryGuard:
    """The guard reads the (injected) memory before admitting a generation."""

    @pytest.fixture(autouse=True)
    def _normal_memory_afterwards(self, harness: Harness) -> Iterator[None]:
        yield
        (harness.control / "memory.json").unlink(missing_ok=True)

    def test_low_water_is_memory_pressure(self, harness: Harness) -> None:
        harness.set_memory(available_mib=10, limit_mib=16_000)
        response = httpx.post(harness.server.base_url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        assert response.json()["error"]["code"] == "memory_pressure"

    def test_not_enough_now_is_insufficient_memory(self, harness: Harness) -> None:
        """Above the low-water mark but short of a 1,024-token generation's ~41 MiB."""
        harness.set_memory(available_mib=30, limit_mib=16_000)
        body = {**CHAT, "max_tokens": 1000}
        response = httpx.post(harness.server.base_url + "/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        assert response.json()["error"]["code"] == "insufficient_memory"

    def test_more_than_the_machine_has_is_507_without_retry_after(self, harness: Harness) -> None:
        harness.set_memory(available_mib=70, limit_mib=30)
        body = {**MESSAGE, "max_tokens": 1000}
        response = httpx.post(harness.server.base_url + "/v1/messages", json=body, timeout=30)
        assert response.status_code == 507
        assert "retry-after" not in response.headers
        body = response.json()
        assert body["type"] == "error"  # the Anthropic envelope on /v1/messages
        assert body["error"]["code"] == "insufficient_memory_permanent"

    def test_requests_pass_when_memory_returns(self, harness: Harness) -> None:
        harness.set_memory(available_mib=4_000, limit_mib=16_000)
        response = httpx.post(harness.server.base_url + "/v1/chat/completions", json=CHAT, timeout=60)
        assert response.status_code == 200


class TestDeviceLost:
    def test_lost_engine_then_recovery(self, harness: Harness) -> None:
        """A decode that fails like a lost GPU ends the request cleanly, then every request is 503
        device_lost while /ready says recovering; once the model reloads, requests work again."""
        base = harness.server.base_url
        harness.switch("load-fails", on=True)  # keep it recovering until the test lets it reload
        harness.switch("decode-fails", on=True)
        with httpx.stream(
            "POST", base + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=60
        ) as r:
            assert r.status_code == 200  # the headers went out before the decode failed
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        error = json.loads(events[-1][6:])["error"]
        assert error["code"] == "device_lost"

        assert httpx.get(base + "/health", timeout=10).json() == {"status": "device_lost"}
        ready = httpx.get(base + "/ready", timeout=10)
        assert (ready.status_code, ready.json()["status"]) == (503, "recovering")
        for path, body in (
            ("/v1/chat/completions", CHAT),
            ("/completion", {"prompt": "x"}),
            ("/v1/messages", MESSAGE),
        ):
            response = httpx.post(base + path, json=body, timeout=10)
            assert response.status_code == 503, path
            assert "device_lost" in response.text, path

        harness.switch("decode-fails", on=False)
        harness.switch("load-fails", on=False)
        deadline = time.monotonic() + 90
        while httpx.get(base + "/ready", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the model was not reloaded"
            time.sleep(0.5)
        assert httpx.get(base + "/health", timeout=10).json() == {"status": "ok"}
        assert httpx.post(base + "/v1/chat/completions", json=CHAT, timeout=60).status_code == 200
        assert "the model was reloaded after the engine was lost" in harness.server.output()


KEY = "ops-secret-key"
WRONG_KEY = "not-the-key-0451"
ORIGIN = "http://localhost:3000"


@pytest.fixture(name="hardened", scope="module")
def _hardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    command = [
        bubo_command(), "serve", "--port", str(port), "-c", "1024", "--api-key", KEY, "--debug-hooks",
        "--cors-origins", ORIGIN, "--max-body-mib", "1", "--max-queue", "1", "--log-level", "debug",
        "--parallel", "1",  # one slot: the second generation queues (test_bounded_queue)
    ]  # fmt: skip
    server = start_server(command, port, tmp_path_factory.mktemp("hardened") / "serve.log", api_key=KEY)
    yield server
    assert stop_server(server) == 0
    log = server.output()
    assert KEY not in log
    assert WRONG_KEY not in log


@pytest.fixture(name="client")
def _client(hardened: Server) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=hardened.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    ) as c:
        yield c


class TestDebugHooks:
    def test_prompt_shows_text_and_tokens(self, client: httpx.Client) -> None:
        body = client.post("/debug/prompt", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
        assert body["prompt"].endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        assert body["n_tokens"] == len(body["tokens"]) == len(body["pieces"])
        assert "".join(body["pieces"]) == body["prompt"]

    def test_cache_lists_the_slot_and_snapshots(self, client: httpx.Client) -> None:
        client.post("/v1/chat/completions", json=CHAT)
        body = client.get("/debug/cache").json()
        assert body["live_tokens"] > 0
        assert (
            0 < body["budget_bytes"] <= 8192 * MIB
        )  # --cache-ram auto: a quarter of free memory, at most 8 GiB
        assert isinstance(body["snapshots"], list)

    def test_settings_are_effective_and_redacted(self, client: httpx.Client) -> None:
        body = client.get("/debug/settings").json()
        assert body["server"]["api_key"] == "<redacted>"
        assert body["server"]["max_queue"] == 1
        assert body["model"]["ctx_size"] == 1024

    def test_absent_without_the_flag(self, http: httpx.Client) -> None:
        """The shared server runs without --debug-hooks: the paths do not exist."""
        for method, path in (("POST", "/debug/prompt"), ("GET", "/debug/cache"), ("GET", "/debug/settings")):
            response = http.request(method, path, json={} if method == "POST" else None)
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "not_found"

    def test_refused_on_a_non_loopback_address(self) -> None:
        """The server does not start (nothing is bound) and says why in one line."""
        done = subprocess.run(
            [bubo_command(), "serve", "--debug-hooks", "--host", "0.0.0.0"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert "--debug-hooks" in done.stderr
        assert "loopback" in done.stderr


class TestLimits:
    def test_body_too_large_in_each_dialect(self, client: httpx.Client) -> None:
        big = "x" * (MIB + 1024)
        openai = client.post(
            "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": big}]}
        )
        assert openai.status_code == 413
        assert openai.json()["error"]["code"] == "payload_too_large"
        assert openai.headers["connection"] == "close"  # the rest of the body is not read
        anthropic = client.post(
            "/v1/messages", json={**MESSAGE, "messages": [{"role": "user", "content": big}]}
        )
        assert anthropic.status_code == 413
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "request_too_large"

    def test_generation_time_limit(self, http: httpx.Client) -> None:
        """t_max_predict_ms ends a generation that would run for a minute after about that long.

        As in llama-server, the limit applies once the output has a new line.
        """
        prompt = "The numbers from 1 to 1000, one per line:\n1\n2\n3\n"
        body = {"prompt": prompt, "n_predict": 5000, "ignore_eos": True, "t_max_predict_ms": 400}
        answer = http.post("/completion", json=body).json()
        assert answer["stop_type"] == "limit"
        assert 0 < answer["tokens_predicted"] < 5000
        assert 400 <= answer["timings"]["predicted_ms"] < 3000

    def test_bounded_queue(self, client: httpx.Client, hardened: Server) -> None:
        """One generation runs, one waits (--max-queue 1): the next is 503 queue_full with Retry-After.

        A streaming request is refused the same way, before any stream starts
        (the soak test found it once cut off mid-response instead).
        """
        long = {"prompt": "Once upon a time", "n_predict": 2000, "ignore_eos": True, "stream": True}
        headers = {"Authorization": f"Bearer {KEY}"}
        waiting: dict[str, int] = {}
        with httpx.stream(
            "POST", hardened.base_url + "/completion", json=long, headers=headers, timeout=60
        ) as running:
            lines = running.iter_lines()  # kept: a closed iterator would close the stream
            next(lines)  # generating now

            def wait_in_queue() -> None:
                waiting["status"] = client.post(
                    "/completion", json={"prompt": "Hi", "n_predict": 2}
                ).status_code

            queued = threading.Thread(target=wait_in_queue)
            queued.start()
            deadline = time.monotonic() + 10
            while "llamacpp:requests_deferred 1.0" not in client.get("/metrics").text.splitlines():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            refused = client.post("/completion", json={"prompt": "Hi", "n_predict": 2})
            refused_stream = client.post(
                "/v1/chat/completions",
                json={"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "stream": True},
            )
        # leaving the stream cancels the long generation; the queued request then runs
        queued.join(timeout=60)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == "queue_full"
        assert refused_stream.status_code == 503
        assert refused_stream.headers["retry-after"] == "5"
        assert refused_stream.json()["error"]["code"] == "queue_full"
        assert waiting == {"status": 200}


class TestEdges:
    def test_cors_only_for_the_configured_origin(self, hardened: Server) -> None:
        preflight = httpx.options(
            hardened.base_url + "/v1/chat/completions",
            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization,content-type"},
            timeout=10,
        )  # fmt: skip
        assert preflight.status_code == 200  # no key: browsers send preflights without credentials
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        other = httpx.get(
            hardened.base_url + "/health",
            headers={"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"},
            timeout=10,
        )
        assert "access-control-allow-origin" not in other.headers
        assert other.status_code == 403  # another origin is refused outright, the key notwithstanding

    def test_an_error_before_the_body_is_read_keeps_the_connection_usable(self, server: Server) -> None:
        """A 404 decided before the handler reads the body, then the next request on the same connection.

        Hypercorn stalled that connection when the body was left unread: the
        next request was never answered (found by CI, reproduced in about half
        of fresh-server runs).
        """
        with httpx.Client(base_url=server.base_url, timeout=5) as client:
            for _ in range(30):
                assert client.post("/debug/prompt", json={"messages": []}).status_code == 404
                assert client.post("/no/such/path", content=b"x" * 5000).status_code == 404
                assert client.get("/health").status_code == 200

    def test_no_cors_without_the_flag(self, http: httpx.Client) -> None:
        response = http.get("/health", headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in response.headers

    def test_request_id_in_header_error_body_and_access_log(
        self, client: httpx.Client, hardened: Server
    ) -> None:
        response = client.post("/v1/messages", json={"model": "nope"}, headers={"X-Request-Id": "req-e2e-42"})
        assert response.headers["x-request-id"] == "req-e2e-42"
        assert response.json()["request_id"] == "req-e2e-42"  # the Anthropic envelope carries it
        generated = client.get("/health").headers["x-request-id"]
        deadline = time.monotonic() + 5
        while f"request_id={generated}" not in hardened.output():
            assert time.monotonic() < deadline, "the access log lacks the request id"
            time.sleep(0.1)
        assert "request_id=req-e2e-42" in hardened.output()

    def test_wrong_keys_are_refused_and_never_logged(self, hardened: Server) -> None:
        response = httpx.get(
            hardened.base_url + "/v1/models", headers={"Authorization": f"Bearer {WRONG_KEY}"}, timeout=10
        )
        assert response.status_code == 401
        assert WRONG_KEY not in hardened.output()  # checked again, with the real key, at shutdown


class TestShutdown:
    """SIGTERM: no new connections, running requests finish until the deadline, exit 0."""

    def start(self, tmp_path: Path, *extra: str) -> Server:
        port = free_port()
        command = [bubo_command(), "serve", "--port", str(port), "-c", "1024", *extra]
        return start_server(command, port, tmp_path / "serve.log")

    def test_a_running_stream_finishes(self, tmp_path: Path) -> None:
        """New requests meanwhile are refused: 503 not_ready, and /ready says "stopping".

        The deadline is not what this shows: it is long, so that 200 tokens on a loaded machine fit in it.
        """
        server = self.start(tmp_path, "--shutdown-timeout", "300")
        body = {"prompt": "Count:", "n_predict": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.base_url + "/completion", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            server.process.terminate()
            time.sleep(0.5)  # the signal is handled
            refused = httpx.post(
                server.base_url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=10
            )
            ready = httpx.get(server.base_url + "/ready", timeout=10)
            rest = [line for line in lines if line.startswith("data: ")]
        assert json.loads(rest[-1][6:])["stop"] is True, rest[-1]
        assert json.loads(rest[-1][6:])["tokens_predicted"] == 200
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "not_ready"
        assert "shutting down" in refused.json()["error"]["message"]
        assert ready.status_code == 503
        assert ready.json()["status"] == "stopping"
        assert server.process.wait(timeout=30) == 0
        assert "stopped; the model is freed" in server.output()

    def test_during_the_drain_delay_ready_is_503_and_every_request_is_served(self, tmp_path: Path) -> None:
        """--drain-delay: a gateway polling /ready takes the server out while what it still sends gets 200.

        A stream runs when SIGTERM arrives; then /ready answers 503 "stopping" (/health stays 200), and
        new requests arriving meanwhile are answered in full; the stream finishes; the server exits 0.
        """
        server = self.start(tmp_path, "--drain-delay", "30", "-np", "2")
        body = {"prompt": "Count:", "n_predict": 64, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.base_url + "/completion", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            server.process.terminate()
            for _ in range(100):  # the signal is handled within a few polls
                ready = httpx.get(server.base_url + "/ready", timeout=10)
                if ready.status_code != 200:
                    break
                time.sleep(0.1)
            health = httpx.get(server.base_url + "/health", timeout=10)
            arriving = [
                httpx.post(server.base_url + "/completion", json={"prompt": "Hi", "n_predict": 4}, timeout=60)
                for _ in range(3)
            ]
            rest = [line for line in lines if line.startswith("data: ")]
        assert ready.status_code == 503
        assert ready.json()["status"] == "stopping"
        assert health.status_code == 200
        assert [r.status_code for r in arriving] == [200, 200, 200]
        assert all(r.json()["tokens_predicted"] == 4 for r in arriving)
        assert json.loads(rest[-1][6:])["tokens_predicted"] == 64
        assert server.process.wait(timeout=90) == 0
        output = server.output()
        assert "SIGTERM: /ready answers 503; requests are still served for 30 s (--drain-delay)" in output
        assert output.index("(--drain-delay)") < output.index("SIGTERM: no new requests")
        assert "stopped; the model is freed" in output

    def test_idle_keep_alive_connections_do_not_delay_the_exit(self, tmp_path: Path) -> None:
        """Agents keep a connection open between turns; with nothing running, exit is prompt."""
        server = self.start(tmp_path)  # --shutdown-timeout 30
        with httpx.Client(base_url=server.base_url, timeout=10) as client:
            assert client.post("/completion", json={"prompt": "Hi", "n_predict": 2}).status_code == 200
            started = time.monotonic()
            server.process.terminate()
            assert server.process.wait(timeout=30) == 0
        assert time.monotonic() - started < 10
        assert "stopped; the model is freed" in server.output()

    def test_the_deadline_ends_every_request_with_its_dialects_error(self, tmp_path: Path) -> None:
        """At --shutdown-timeout the running stream and the queued requests each end with a word.

        The running llama-server stream and the queued OpenAI and Anthropic
        streams (their 200 headers already sent) end with their dialect's error
        event; a queued request without a stream gets a 503.  All say not_ready.
        """
        server = self.start(
            tmp_path, "--shutdown-timeout", "1", "--parallel", "1"
        )  # one runs, the rest queue
        base = server.base_url
        chat = {"model": "bubo", "max_tokens": 5000, "messages": [{"role": "user", "content": "Count."}]}
        queued = {
            "openai stream": ("/v1/chat/completions", {**chat, "stream": True}),
            "anthropic stream": ("/v1/messages", {**chat, "stream": True}),
            "plain": ("/v1/chat/completions", chat),
        }
        answers: dict[str, tuple[int, str]] = {}

        def ask(name: str, path: str, body: dict[str, object]) -> None:
            response = httpx.post(base + path, json=body, timeout=60)
            answers[name] = (response.status_code, response.text)

        running = {"prompt": "Count:", "n_predict": 5000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/completion", json=running, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            threads = [threading.Thread(target=ask, args=(n, *a)) for n, a in queued.items()]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while "llamacpp:requests_deferred 3.0" not in httpx.get(base + "/metrics", timeout=10).text:
                assert time.monotonic() < deadline, "the three requests never queued"
                time.sleep(0.05)
            server.process.terminate()
            rest = [line for line in lines if line.startswith("data: ")]
            for thread in threads:
                thread.join(timeout=30)
        assert json.loads(rest[-1][6:])["error"]["code"] == "not_ready"
        assert "shutting down" in json.loads(rest[-1][6:])["error"]["message"]
        status, text = answers["openai stream"]
        assert status == 200
        assert json.loads(text.strip().splitlines()[-1][6:])["error"]["code"] == "not_ready"
        status, text = answers["anthropic stream"]
        assert status == 200
        event, data = text.strip().split("\n\n")[-1].splitlines()
        assert event == "event: error"
        assert json.loads(data[6:])["error"]["type"] == "overloaded_error"
        status, text = answers["plain"]
        assert status == 503
        assert json.loads(text)["error"]["code"] == "not_ready"
        assert server.process.wait(timeout=30) == 0  # the 5,000-token stream was cut, not awaited
        assert "stopped; the model is freed" in server.output()
