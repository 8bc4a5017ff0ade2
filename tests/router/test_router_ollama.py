"""Ollama's API in router mode, over stand-in children: listing, pull, unloading, names, broken streams."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from quart_trio import QuartTrio

from bubo.config import load_settings
from bubo.router import create_router_app

from .._asgi import exchange
from .test_router_app import AUTH, WAIT_S, context, exited, settled, stand_in


@pytest.fixture(name="router")
async def _router(tmp_path: Path, model_path: Path) -> AsyncIterator[QuartTrio]:
    """Models a and b (the default model's file), and broken (no GGUF: left out of /api/tags)."""
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.gguf").symlink_to(model_path)
    (folder / "broken.gguf").write_bytes(b"GGUF")
    settings = load_settings({"router__models_dir": str(folder)}, environ={})
    app = create_router_app(settings, inherited=(), environ=dict(os.environ), command=stand_in)
    async with app.test_app() as test_app:
        yield test_app  # type: ignore[misc]


async def get_json(app: QuartTrio, path: str) -> object:
    return await (await app.test_client().get(path, headers=AUTH)).get_json()


async def test_tags_list_the_directory_and_ps_the_loaded(router: QuartTrio) -> None:
    """Every readable model of the directory in tags without loading any; ps once one is loaded."""
    tags = await get_json(router, "/api/tags")
    assert [m["name"] for m in tags["models"]] == ["a:latest", "b:latest"]  # type: ignore[index]
    assert tags["models"][0]["details"]["quantization_level"] == "Q4_1"  # type: ignore[index]
    assert await get_json(router, "/api/ps") == {"models": []}
    shown = await router.test_client().post("/api/show", json={"model": "A:Latest"}, headers=AUTH)
    echo = await shown.get_json()
    assert (echo["model"], echo["path"]) == ("a", "/api/show")  # forwarded to a's child by Ollama's names
    ps = await get_json(router, "/api/ps")
    assert [(m["name"], m["context_length"]) for m in ps["models"]] == [("a:latest", 99)]  # type: ignore[index]
    assert context(router).registry.records["b"].instance is None


async def test_version_root_and_pull_load_nothing(router: QuartTrio) -> None:
    client = router.test_client()
    assert await get_json(router, "/api/version") == {"version": "0.22.0"}
    assert await (await client.get("/", headers={"Accept": "*/*"})).get_data() == b"Ollama is running"
    pulled = await client.post("/api/pull", json={"model": "b", "stream": False}, headers=AUTH)
    assert await pulled.get_json() == {"status": "success"}
    missing = await client.post("/api/pull", json={"model": "llama3.2"}, headers=AUTH)
    assert (missing.status_code, await missing.get_json()) == (404, {"error": "model 'llama3.2' not found"})
    assert all(r.instance is None for r in context(router).registry.records.values())


async def test_keep_alive_0_really_unloads(router: QuartTrio) -> None:
    """An empty chat with keep_alive 0 stops the model's child; the model reads unloaded."""
    client = router.test_client()
    await client.post(
        "/api/chat", json={"model": "a", "messages": [{"role": "user", "content": "x"}]}, headers=AUTH
    )
    record = context(router).registry.records["a"]
    instance = await settled(record)
    answer = await client.post(
        "/api/chat", json={"model": "a:latest", "messages": [], "keep_alive": 0}, headers=AUTH
    )
    body = await answer.get_json()
    assert (body["done"], body["done_reason"], body["model"]) == (True, "unload", "a:latest")
    await exited(instance)
    assert record.instance is None
    again = await client.post("/api/generate", json={"model": "b", "keep_alive": "0s"}, headers=AUTH)
    assert (await again.get_json())["done_reason"] == "unload"  # not loaded: nothing to stop
    assert context(router).registry.records["b"].instance is None


@pytest.mark.parametrize("policy", ["extend", "ignore"])
async def test_keep_alive_0_unloads_nothing_when_the_operator_says_so(
    tmp_path: Path, model_path: Path, policy: str
) -> None:
    """With --ollama-keep-alive extend or ignore the request goes to the child, which keeps its model."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "a.gguf").symlink_to(model_path)
    settings = load_settings(
        {"router__models_dir": str(folder), "server__ollama_keep_alive": policy}, environ={}
    )
    app = create_router_app(settings, inherited=(), environ=dict(os.environ), command=stand_in)
    async with app.test_app() as router:
        client = router.test_client()
        answer = await client.post(
            "/api/chat", json={"model": "a", "messages": [], "keep_alive": 0}, headers=AUTH
        )
        assert (await answer.get_json())["path"] == "/api/chat"  # the child's echo: forwarded, not unloaded
        record = context(router).registry.records["a"]
        instance = await settled(record)
        assert record.instance is instance
        refused = await client.post("/api/chat", json={"model": "a", "messages": [], "keep_alive": "1s x"})
        assert refused.status_code == 400  # still read first, whatever the policy


async def test_errors_are_ollama_s(router: QuartTrio) -> None:
    response = await router.test_client().post("/api/embed", json={"model": "zzz"}, headers=AUTH)
    assert (response.status_code, await response.get_json()) == (404, {"error": "model 'zzz' not found"})
    refused = await router.test_client().get("/api/tags")
    assert refused.status_code == 200  # no --api-key here


@pytest.mark.parametrize("how", ["during", "mid-event"])
async def test_a_child_dying_mid_stream_ends_it_with_an_error_line(router: QuartTrio, how: str) -> None:
    """The last line is {"error": ...} (503 model_failed), on a line of its own."""
    body = json.dumps({"model": "a", "messages": [], "stream": True, "die": how}).encode()
    with trio.fail_after(WAIT_S):
        async with exchange(router.app, "/api/chat", body) as ex:
            data = await ex.read_all()
    lines = data.decode().split("\n")
    assert lines[-1] == ""
    assert json.loads(lines[0]) == {"model": "a", "n": 0}
    error = json.loads(lines[-2])
    assert set(error) == {"error"}
    assert "status 3" in error["error"]
