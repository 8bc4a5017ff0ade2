"""The browser boundary through a real `bubo serve` (and `hypercorn bubo.app:app`), with spoofed headers.

What a web page can make a browser send (another Origin, a rebound Host,
Sec-Fetch-Site: cross-site) is refused with 403 before the key and the body,
and runs no generation (``/metrics``' decode counter stays put); what curl
sends is served.  docs/security.md, "The browser boundary".
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

KEY = "boundary-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
EVIL = "http://evil.example"
COUNTERS = ("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total")


@pytest.fixture(name="served", scope="module")
def _served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`bubo serve` on 127.0.0.1 with an API key and --allowed-hosts for one name."""
    log = tmp_path_factory.mktemp("boundary") / "serve.log"
    with serving(log, "--api-key", KEY, "--allowed-hosts", "llm.example.test", api_key=KEY) as server:
        yield server


def generation_counters(server: Server) -> dict[str, str]:
    """The decode counters of /metrics: they move with every generation."""
    text = httpx.get(server.base_url + "/metrics", headers=AUTH, timeout=10).text
    return {line.split()[0]: line.split()[1] for line in text.splitlines() if line.startswith(COUNTERS)}


def test_cross_origin_requests_run_nothing(served: Server) -> None:
    """A text/plain POST, a JSON POST with the key, and a GET from another origin: 403, no generation."""
    before = generation_counters(served)
    url = served.base_url + "/v1/chat/completions"
    refused = [
        httpx.post(
            url, content=json.dumps(CHAT), headers={"Origin": EVIL, "Content-Type": "text/plain"}, timeout=10
        ),
        httpx.post(url, json=CHAT, headers={"Origin": EVIL, **AUTH}, timeout=10),
        httpx.post(served.base_url + "/api/chat", json=CHAT, headers={"Origin": "null", **AUTH}, timeout=10),
        httpx.post(url, json=CHAT, headers={"Sec-Fetch-Site": "cross-site", **AUTH}, timeout=10),
        httpx.get(served.base_url + "/props", headers={"Origin": EVIL, **AUTH}, timeout=10),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert {r.json()["error"]["code"] for r in refused if r.request.url.path != "/api/chat"} == {
        "origin_not_allowed"
    }
    assert "--cors-origins" in refused[2].json()["error"]  # Ollama's {"error": "..."}
    assert generation_counters(served) == before
    assert "--cors-origins" in served.output()  # the log line says which flag admits the origin


def test_rebound_host_is_refused(served: Server) -> None:
    """Host rebind.test on 127.0.0.1, with the key and the page's own Origin: 403 naming --allowed-hosts."""
    port = served.base_url.rsplit(":", 1)[1]
    for path in ("/props", "/slots", "/v1/models"):
        response = httpx.get(
            served.base_url + path,
            headers={"Host": f"rebind.test:{port}", "Origin": f"http://rebind.test:{port}", **AUTH},
            timeout=10,
        )
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "host_not_allowed"
    assert "--allowed-hosts rebind.test" in served.output()


def test_allowed_host_and_loopback_names_are_served(served: Server) -> None:
    """--allowed-hosts' name, localhost, 127.0.0.1 and [::1] (as Host) are served."""
    port = served.base_url.rsplit(":", 1)[1]
    for host in ("llm.example.test", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        response = httpx.get(served.base_url + "/props", headers={"Host": host, **AUTH}, timeout=10)
        assert response.status_code == 200, host


def test_clients_without_a_browser_are_served(served: Server) -> None:
    """curl -d (form content type, no Origin) and the page's own Origin generate."""
    before = generation_counters(served)
    curl_like = httpx.post(
        served.base_url + "/completion",
        content=b'{"prompt": "Hi", "n_predict": 2}',
        headers={"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "curl/8.5.0", **AUTH},
        timeout=60,
    )
    assert curl_like.status_code == 200
    own = httpx.post(
        served.base_url + "/v1/chat/completions",
        json=CHAT,
        headers={"Origin": served.base_url, **AUTH},
        timeout=60,
    )
    assert own.status_code == 200
    assert generation_counters(served) != before


def test_a_large_refused_body_is_not_read(served: Server) -> None:
    """A 30 MiB upload from another origin gets its 403 after a few KiB, and the connection closes."""
    port = int(served.base_url.rsplit(":", 1)[1])
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {EVIL}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {30 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head + b"x" * 4096)
        received = b""
        while chunk := connection.recv(65536):  # until the server closes: it does not wait for 30 MiB
            received += chunk
    assert received.startswith(b"HTTP/1.1 403")
    assert b"origin_not_allowed" in received


def test_under_hypercorn(server: Server) -> None:
    """`hypercorn bubo.app:app` on 127.0.0.1 applies the same checks."""
    response = httpx.get(server.base_url + "/props", headers={"Host": "rebind.test"}, timeout=10)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "host_not_allowed"
    assert httpx.get(server.base_url + "/props", timeout=10).status_code == 200
