"""Two Bubo replicas behind nginx with the shipped config (deploy/nginx/bubo.conf), all on loopback.

The config is the one docs/deploy.md documents; only the replicas' addresses, the
listening port and the log paths are rewritten. nginx runs as the current user in a
temporary prefix (``daemon off``), every process is stopped by its PID. A missing
nginx fails the test: `.ci/run` installs it.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest

from .._sse import payloads
from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

SHIPPED_CONFIG = Path(__file__).parents[2] / "deploy" / "nginx" / "bubo.conf"
# The name clients use for nginx; the replicas listen on 127.0.0.1, so they admit it (docs/deploy.md).
PUBLIC_NAME = "llm.example.test"

# long enough that its prefix is a real hit (the cache reports hits of at least 64 tokens)
HANDBOOK = " ".join(
    f"Rule {n}: answer in one short sentence, name the source, and never invent a number." for n in range(12)
)

MAIN_CONFIG = """\
daemon off;
master_process on;
worker_processes 1;
user {user};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {site};
}}
"""


def nginx_binary() -> str:
    """nginx from the system package (/usr/sbin is not on every user's PATH)."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.fail(
            "nginx is not installed (`nox -s tests` installs Debian's package: apt-get install nginx)"
        )
    return found


def site_config(port: int, replicas: list[Server], access_log: Path) -> str:
    """The shipped config with these replicas, this port and this access log; nothing else changes."""
    text = SHIPPED_CONFIG.read_text()
    servers = re.findall(r"^    server \S+ (max_fails=.*;)$", text, flags=re.MULTILINE)
    assert len(servers) == 2, "the shipped upstream lists two example replicas"
    lines = "\n".join(
        f"    server {replica.base_url.removeprefix('http://')} {servers[0]}" for replica in replicas
    )
    text, count = re.subn(r"(^    server \S+ max_fails=.*;\n)+", lines + "\n", text, flags=re.MULTILINE)
    assert count == 1
    text, count = re.subn(r"^    listen 8080;$", f"    listen 127.0.0.1:{port};", text, flags=re.MULTILINE)
    assert count == 1
    text, count = re.subn(r"access_log \S+ bubo;", f"access_log {access_log} bubo;", text)
    assert count == 1
    return text


@attrs.define
class Cluster:
    """Replicas and the nginx in front of them."""

    replicas: list[Server]
    nginx: subprocess.Popen[bytes]
    url: str
    prefix: Path

    def replica_at(self, response: httpx.Response) -> Server:
        """The replica that answered *response* (the last address nginx tried)."""
        address = response.headers["X-Bubo-Upstream"].split(",")[-1].strip()
        return next(r for r in self.replicas if r.base_url == f"http://{address}")

    def keys_by_replica(self, count: int = 32) -> dict[str, list[str]]:
        """*count* conversation ids, grouped by the replica (base URL) nginx sends them to."""
        groups: dict[str, list[str]] = {replica.base_url: [] for replica in self.replicas}
        with httpx.Client(base_url=self.url, timeout=30) as client:
            for n in range(count):
                key = f"conversation-{n}"
                response = client.get("/health", headers={"X-Conversation-Id": key})
                assert response.status_code == 200, response.text
                groups[self.replica_at(response).base_url].append(key)
        return groups


def start_nginx(prefix: Path, replicas: list[Server]) -> Cluster:
    """nginx in the foreground with the shipped site config; wait (at most 30 s) until it proxies."""
    port = free_port()
    site = prefix / "bubo.conf"
    site.write_text(site_config(port, replicas, prefix / "access.log"))
    main = prefix / "nginx.conf"
    main.write_text(MAIN_CONFIG.format(user=getpass.getuser(), prefix=prefix, site=site))
    command = [nginx_binary(), "-p", str(prefix), "-c", str(main), "-e", str(prefix / "error.log")]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stderr
    with (prefix / "stderr.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    cluster = Cluster(replicas=replicas, nginx=process, url=f"http://127.0.0.1:{port}", prefix=prefix)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, (prefix / "error.log").read_text()
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(cluster.url + "/ready", timeout=2).status_code == 200:
                return cluster
        time.sleep(0.1)
    stop_nginx(process)
    raise AssertionError("nginx did not proxy within 30 s:\n" + (prefix / "error.log").read_text())


def stop_nginx(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (nginx's fast shutdown), SIGKILL after 10 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextlib.contextmanager
def cluster_of_two(directory: Path) -> Iterator[Cluster]:
    """Two `bubo serve` replicas (default model, 1,024-token context, two slots) and nginx."""
    replicas: list[Server] = []
    try:
        for n in range(2):
            port = free_port()
            command = [
                bubo_command(), "serve", "--port", str(port), "-c", "1024", "-np", "2",
                "--shutdown-timeout", "120", "--allowed-hosts", PUBLIC_NAME,
            ]  # fmt: skip
            replicas.append(
                start_server(command, port, directory / f"replica-{n}.log", {"BUBO_THREADS": "1"})
            )
        prefix = directory / "nginx"
        prefix.mkdir()
        cluster = start_nginx(prefix, replicas)
        try:
            yield cluster
        finally:
            stop_nginx(cluster.nginx)
    finally:
        for replica in replicas:
            stop_server(replica)


@pytest.fixture(name="cluster", scope="module")
def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster_of_two(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def chat(client: httpx.Client, key: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": "bubo", "messages": messages, "max_tokens": 8, "temperature": 0}
    response = client.post("/v1/chat/completions", json=body, headers={"X-Conversation-Id": key})
    assert response.status_code == 200, response.text
    return response


class TestAffinity:
    def test_second_turn_lands_on_the_first_turns_replica_and_reuses_its_cache(
        self, cluster: Cluster
    ) -> None:
        """The same turn sent under a conversation id of the other replica is a cache miss there."""
        keys = cluster.keys_by_replica()
        system = {
            "role": "system",
            "content": f"You are a helpful assistant ({uuid.uuid4().hex}). {HANDBOOK}",
        }
        with httpx.Client(base_url=cluster.url, timeout=120) as client:
            home, elsewhere = keys.values()
            first = chat(client, home[0], [system, {"role": "user", "content": "Hello?"}])
            answer = first.json()["choices"][0]["message"]["content"]
            turn = [
                system,
                {"role": "user", "content": "Hello?"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "What is the capital of France?"},
            ]
            second = chat(client, home[0], turn)
            stranger = chat(client, elsewhere[0], turn)
        assert cluster.replica_at(second) is cluster.replica_at(first)
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first.json()["usage"]["prompt_tokens"] - 8  # everything up to the new turn
        assert cluster.replica_at(stranger) is not cluster.replica_at(first)
        assert stranger.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < 64

    def test_conversations_spread_over_both_replicas_and_each_stays_put(self, cluster: Cluster) -> None:
        keys = cluster.keys_by_replica()
        assert all(keys.values()), keys  # 32 conversations, none of the replicas left out
        assert cluster.keys_by_replica() == keys

    def test_a_session_id_is_the_fallback_key(self, cluster: Cluster) -> None:
        keys = cluster.keys_by_replica()
        with httpx.Client(base_url=cluster.url, timeout=30) as client:
            for base_url, group in keys.items():
                for key in group[:3]:
                    response = client.get("/health", headers={"X-Session-Id": key})
                    assert cluster.replica_at(response).base_url == base_url


def test_the_browser_boundary_behind_nginx(cluster: Cluster) -> None:
    """The public name reaches the replicas, with a page's own Origin; another name or origin is refused."""
    port = cluster.url.rsplit(":", 1)[1]
    public = f"{PUBLIC_NAME}:{port}"
    body = {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with httpx.Client(base_url=cluster.url, timeout=120) as client:
        page = client.post(
            "/v1/chat/completions", json=body, headers={"Host": public, "Origin": f"http://{public}"}
        )
        assert page.status_code == 200, page.text  # the chat page, opened as http://llm.example.test:PORT/
        assert client.get("/", headers={"Host": public, "Accept": "text/html"}).status_code == 200
        rebound = client.get("/props", headers={"Host": f"rebind.test:{port}"})
        assert rebound.status_code == 403
        assert rebound.json()["error"]["code"] == "host_not_allowed"
        other = client.post(
            "/v1/chat/completions", json=body, headers={"Host": public, "Origin": "http://evil.example"}
        )
        assert other.status_code == 403
        assert other.json()["error"]["code"] == "origin_not_allowed"


def test_a_stream_reaches_the_client_while_it_is_generated(cluster: Cluster) -> None:
    """nginx holds nothing back: the first event arrives while the replica is still generating."""
    body = {"prompt": "Count:", "n_predict": 200, "ignore_eos": True, "stream": True}
    headers = {"X-Conversation-Id": f"stream-{uuid.uuid4().hex}"}
    with httpx.stream("POST", cluster.url + "/completion", json=body, headers=headers, timeout=120) as stream:
        replica = cluster.replica_at(stream)
        lines = stream.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        processing = httpx.get(replica.base_url + "/metrics", timeout=30).text
        events = payloads(lines)
    assert first["stop"] is False
    assert "llamacpp:requests_processing 1.0" in processing
    assert events[-1]["stop"] is True
    assert events[-1]["tokens_predicted"] == 200


def test_a_replica_taken_down_is_drained_without_failed_requests(tmp_path: Path) -> None:
    """SIGTERM one replica while it generates: its requests finish, new ones go to the other, no error.

    Bubo refuses new work with 503 while draining; nginx passes the refused request
    to the other replica (nothing had reached the client yet) and then leaves the
    draining replica out. Once it has exited, refused connections do the same.
    """
    with cluster_of_two(tmp_path) as cluster:
        keys = cluster.keys_by_replica()
        other, draining = sorted(cluster.replicas, key=lambda replica: len(keys[replica.base_url]))
        ours = keys[draining.base_url]
        statuses: list[int] = []
        answered_by: list[list[str]] = []
        plain: dict[str, httpx.Response] = {}

        def ask(key: str) -> None:
            body = {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            response = httpx.post(
                cluster.url + "/v1/chat/completions",
                json=body,
                headers={"X-Conversation-Id": key},
                timeout=120,
            )
            statuses.append(response.status_code)
            answered_by.append([a.strip() for a in response.headers["X-Bubo-Upstream"].split(",")])

        def generate() -> None:
            body = {"prompt": "Count:", "n_predict": 100, "ignore_eos": True}
            plain["response"] = httpx.post(
                cluster.url + "/completion", json=body, headers={"X-Conversation-Id": ours[1]}, timeout=300
            )

        stream_body = {"prompt": "List:", "n_predict": 160, "ignore_eos": True, "stream": True}
        with httpx.stream(
            "POST",
            cluster.url + "/completion",
            json=stream_body,
            headers={"X-Conversation-Id": ours[0]},
            timeout=300,
        ) as stream:
            assert stream.status_code == 200
            assert cluster.replica_at(stream) is draining
            lines = stream.iter_lines()
            next(lines)
            worker = threading.Thread(target=generate)
            worker.start()
            deadline = time.monotonic() + 60
            while "llamacpp:requests_processing 2.0" not in httpx.get(draining.base_url + "/metrics").text:
                assert time.monotonic() < deadline, "the plain generation never started"
                time.sleep(0.05)

            draining.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while httpx.get(draining.base_url + "/ready").json()["status"] != "stopping":
                assert time.monotonic() < deadline, "the replica never began to drain"
                time.sleep(0.05)
            for key in ours[2:6]:  # new conversations of the draining replica, while it drains
                ask(key)

            events = payloads(lines)
            worker.join(timeout=300)
        assert draining.process.wait(timeout=60) == 0
        for key in ours[:4]:  # and after it has gone
            ask(key)

    assert statuses == [200] * 8
    draining_at = draining.base_url.removeprefix("http://")
    other_at = other.base_url.removeprefix("http://")
    assert answered_by[0] == [draining_at, other_at]  # refused while draining, passed on:
    assert "upstream_status=503, 200 " in (cluster.prefix / "access.log").read_text()
    assert all(tried[-1] == other_at for tried in answered_by)
    assert events[-1]["stop"] is True
    assert events[-1]["tokens_predicted"] == 160
    assert plain["response"].status_code == 200
    assert plain["response"].json()["tokens_predicted"] == 100
