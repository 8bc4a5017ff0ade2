"""`bubo serve` with flags: API key on every route, a real request, a clean exit on SIGTERM."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

KEY = "e2e-secret"


@pytest.fixture(name="keyed_server", scope="module")
def _keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ("--api-key", KEY, "-c", "1024", "--served-model-name", "tiny", "--tags", "e2e,small")
    flags += ("--host", "127.0.0.1,127.0.0.2")  # two loopback addresses, as llama-server's --host takes them
    with serving(tmp_path_factory.mktemp("bubo-serve") / "serve.log", *flags, api_key=KEY) as server:
        yield server
    assert KEY not in server.output()


def test_every_host_is_served(keyed_server: Server) -> None:
    """--host with two addresses: the same server answers on both, /v1/models listing --tags."""
    port = keyed_server.base_url.rsplit(":", 1)[1]
    for host in ("127.0.0.1", "127.0.0.2"):
        response = httpx.get(
            f"http://{host}:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
        )
        assert response.status_code == 200
        assert {tuple(m["tags"]) for m in response.json()["data"]} == {("e2e", "small")}


def test_key_required_everywhere(keyed_server: Server) -> None:
    """Without the key even /health is 401 with WWW-Authenticate: Bearer."""
    for path in ("/health", "/ready", "/v1/models", "/slots"):
        response = httpx.get(keyed_server.base_url + path, timeout=10)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_served_model_name_and_key(keyed_server: Server) -> None:
    """With the key, requests work; the served name and bubo are the model ids."""
    headers = {"Authorization": f"Bearer {KEY}"}
    models = httpx.get(keyed_server.base_url + "/v1/models", headers=headers, timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny", "bubo"]
    assert models["data"][0]["context_length"] == 1024
    answer = httpx.post(
        keyed_server.base_url + "/v1/chat/completions",
        headers=headers,
        json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200


def test_model_load_progress_is_logged(keyed_server: Server) -> None:
    """Loading shows progress on the console."""
    output = keyed_server.output()
    assert "loading model: 100%" in output
    assert "model ready in" in output
