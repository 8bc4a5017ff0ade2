"""The Open WebUI session's own pieces, in the default run: the trap for requests beyond 127.0.0.1 and the fixture writer."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from agents.proxy import Exchange

from ._record import Trap, purpose, write_fixture


def test_the_trap_records_what_a_client_sends_through_it_and_forwards_nothing() -> None:
    """A plain request and a CONNECT (what HTTPS through a proxy starts with) are both refused and kept."""
    with Trap() as trap, httpx.Client(proxy=trap.base_url) as client:
        assert client.get("http://huggingface.co/api/models").status_code == 502
        with pytest.raises(httpx.ProxyError):
            client.get("https://pypi.org/simple/")
    assert trap.attempts == ["GET http://huggingface.co/api/models", "CONNECT pypi.org:443"]


def exchange(number: int, method: str, path: str, body: bytes = b"") -> Exchange:
    return Exchange(number, method, path, {"Host": "127.0.0.1:1", "User-Agent": "aiohttp"}, body, 0.0, 200)


def test_a_fixture_keeps_every_post_the_first_get_of_a_path_and_no_temporary_folder(tmp_path: Path) -> None:
    data = tmp_path / "open-webui" / "data"
    title = {
        "model": "bubo",
        "messages": [{"role": "user", "content": "### Task:\nGenerate a title.\n### Chat"}],
    }
    chat = {"model": "bubo", "messages": [{"role": "user", "content": f"Read {data}/uploads/notes.txt"}]}
    exchanges = [
        exchange(0, "GET", "/api/tags"),
        exchange(1, "POST", "/api/chat", json.dumps(chat).encode()),
        exchange(2, "GET", "/api/tags"),
        exchange(3, "POST", "/api/chat", json.dumps(title).encode()),
        exchange(4, "POST", "/api/generate", b'{"model": "bubo", "keep_alive": 0, "prompt": ""}'),
    ]
    target = tmp_path / "fixtures" / "ollama.json"
    write_fixture(exchanges, target, "0.12.4", tmp_path)
    fixture = json.loads(target.read_text())
    assert fixture["open_webui"] == "0.12.4"
    requests = fixture["requests"]
    assert [(r["method"], r["path"], r["purpose"]) for r in requests] == [
        ("GET", "/api/tags", "GET /api/tags"),
        ("POST", "/api/chat", "chat"),
        ("POST", "/api/chat", "Generate a title."),
        ("POST", "/api/generate", "POST /api/generate"),
    ]
    assert requests[1]["body"]["messages"][0]["content"] == "Read /data/open-webui/data/uploads/notes.txt"
    assert requests[0]["headers"] == {"user-agent": "aiohttp"}
    assert str(tmp_path) not in target.read_text()


def test_a_chat_with_tools_is_named_so() -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function"}]}
    assert purpose("POST", "/v1/chat/completions", body) == "chat with tools"
