"""Open WebUI (the `open-webui` package) against a real `bubo serve`, both on 127.0.0.1, driven in Chromium.

Only `nox -s openwebui` runs these tests (they are marked `openwebui`, which the default run
deselects): the session installs open-webui from PyPI into its own venv, and `open-webui serve`
is found next to this interpreter (or at ``$BUBO_OPEN_WEBUI``); a missing one fails the run.

Bubo serves the default model with the model's own 8,192-token context: Open WebUI 0.12 offers
its 36 built-in tools with every chat (about 7,000 tokens); the tests turn them off for `bubo`, as
a CPU user would (docs/ollama.md), and leave them on for the served id.  A logging proxy (agents/proxy.py)
sits between the two and records every request Open WebUI sends; with
``BUBO_OPENWEBUI_RECORD=DIR`` the session writes them as the fixtures that
tests/e2e/test_openwebui_replays.py replays in the default run.

Open WebUI starts offline (`OFFLINE_MODE`, `HF_HUB_OFFLINE`, no embedding or reranking model,
file contents given to the model whole: `BYPASS_EMBEDDING_AND_RETRIEVAL`), without sign-in,
with its data in a temporary folder, and with every HTTP(S) proxy variable pointing at a
trap on 127.0.0.1 (127.0.0.1 itself excepted): any attempt to reach the internet fails at once,
and the test fails after it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from agents.proxy import Exchange, LoggingProxy
from tests.e2e.conftest import Server, bubo_command, free_port, start_server, stop_server
from tests.openwebui import _record

CONTEXT = "8192"  # the default model's own: Open WebUI's built-in tools alone are about 7,000 tokens
STARTUP_S = 240  # open-webui imports torch and migrates its database at start-up
CONNECTIONS = ("ollama", "openai")


def open_webui_command() -> str:
    """``$BUBO_OPEN_WEBUI``, else `open-webui` beside this interpreter (the session's venv), else on PATH."""
    beside = Path(sys.executable).with_name("open-webui")
    found = os.environ.get("BUBO_OPEN_WEBUI") or (
        str(beside) if beside.exists() else shutil.which("open-webui")
    )
    if not found:
        pytest.fail(
            "no open-webui: run these tests with `nox -s openwebui`, which installs it", pytrace=False
        )
    return found


def offline_environment(data: Path, connection: str, upstream: str, trap: str) -> dict[str, str]:
    """Open WebUI's settings for one connection type to *upstream*, any other address sent to *trap*."""
    proxies = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), trap)
    local = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    if connection == "ollama":
        links = {"ENABLE_OLLAMA_API": "true", "OLLAMA_BASE_URL": upstream, "ENABLE_OPENAI_API": "false"}
    else:
        links = {
            "ENABLE_OLLAMA_API": "false",
            "ENABLE_OPENAI_API": "true",
            "OPENAI_API_BASE_URL": f"{upstream}/v1",
            "OPENAI_API_KEY": "unused",
        }
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BUBO_", "PYTEST"))},
        **proxies,
        **local,
        **links,
        "DATA_DIR": str(data),
        "WEBUI_AUTH": "False",
        "WEBUI_SECRET_KEY": "open-webui-test-secret-key-of-32-bytes",
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "RAG_EMBEDDING_MODEL": "",
        "RAG_RERANKING_MODEL": "",
        "BYPASS_EMBEDDING_AND_RETRIEVAL": "true",
        # of the background tasks after an answer, the title alone: tags and follow-ups would queue two
        # more requests for the single slot after every answer
        "ENABLE_TAGS_GENERATION": "false",
        "ENABLE_FOLLOW_UP_GENERATION": "false",
        "SCARF_NO_ANALYTICS": "true",
        "DO_NOT_TRACK": "true",
        "ANONYMIZED_TELEMETRY": "false",
    }


@attrs.define
class OpenWebUI:
    """A running `open-webui serve` for one connection type; its requests are ``proxy.exchanges[first:]``."""

    connection: str
    process: subprocess.Popen[bytes]
    base_url: str
    log: Path
    proxy: LoggingProxy
    first: int

    def exchanges(self) -> list[Exchange]:
        """What this Open WebUI has sent Bubo so far, in order."""
        return self.proxy.exchanges[self.first :]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(name="bubo", scope="session")
def _bubo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("bubo") / "bubo.log"
    server = start_server(
        [bubo_command(), "serve", "--port", str(port)], port, log, env={"BUBO_CTX_SIZE": CONTEXT}
    )
    yield server
    stop_server(server)


@pytest.fixture(name="proxy", scope="session")
def _proxy(bubo: Server) -> Iterator[LoggingProxy]:
    with LoggingProxy(bubo.base_url) as proxy:
        yield proxy


@pytest.fixture(name="trap", scope="session")
def _trap() -> Iterator[_record.Trap]:
    with _record.Trap() as trap:
        yield trap


@pytest.fixture(name="recordings", scope="session")
def _recordings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Exchange]]]:
    """Each connection type's requests, written as fixtures at the end when ``BUBO_OPENWEBUI_RECORD`` names a folder."""
    recordings: dict[str, list[Exchange]] = {}
    yield recordings
    folder = os.environ.get("BUBO_OPENWEBUI_RECORD")
    if folder:
        version = importlib.metadata.version("open-webui")
        for connection, exchanges in recordings.items():
            target = Path(folder) / f"{connection}.json"
            _record.write_fixture(exchanges, target, version, tmp_path_factory.getbasetemp())


@pytest.fixture(name="webui", scope="module", params=CONNECTIONS)
def _webui(
    request: pytest.FixtureRequest,
    proxy: LoggingProxy,
    trap: _record.Trap,
    recordings: dict[str, list[Exchange]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OpenWebUI]:
    """`open-webui serve` on 127.0.0.1 with Bubo as its only connection, of the type the parameter names."""
    connection = str(request.param)
    folder = tmp_path_factory.mktemp(f"open-webui-{connection}")
    port = free_port()
    log = folder / "open-webui.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [open_webui_command(), "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=folder,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=offline_environment(folder / "data", connection, proxy.base_url, trap.base_url),
            start_new_session=True,
        )
    webui = OpenWebUI(connection, process, f"http://127.0.0.1:{port}", log, proxy, len(proxy.exchanges))
    try:
        wait_healthy(webui)
        yield webui
    finally:
        stop(process)
        recordings[connection] = webui.exchanges()
    assert not trap.attempts, trap.attempts  # what open-webui tried to reach beyond 127.0.0.1


def wait_healthy(webui: OpenWebUI) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if webui.process.poll() is not None:
            pytest.fail(f"open-webui exited with {webui.process.returncode}:\n{webui.output()[-4000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{webui.base_url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"open-webui not healthy within {STARTUP_S} s:\n{webui.output()[-4000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM open-webui's process group (its uvicorn), SIGKILL after 20 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def json_body(exchange: Exchange) -> dict[str, Any]:
    body = exchange.json_body()
    assert isinstance(body, dict), exchange.body[:200]
    return body
