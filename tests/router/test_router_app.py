"""The router over stand-in children (real processes, no model): statuses, forwarding, failures.

Each child is ``stand_in_child.py`` (see there): it requires the key the router
gives it, echoes what it receives, streams behind a gate file, and dies on
request, so these tests check the router's side alone; tests/e2e/test_router.py
runs real ``bubo serve`` children.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from quart_trio import QuartTrio
from tests._listener import Listener

from bubo.api._converter import parse_json_object
from bubo.config import default_model_path, load_settings
from bubo.model import read_model_card
from bubo.router import create_router_app, drain, routes, start_draining
from bubo.router.catalog import CatalogEntry
from bubo.router.context import ROUTER_KEY, RouterContext
from bubo.router.registry import Instance, ModelRecord

from .._asgi import exchange

STAND_IN = Path(__file__).with_name("stand_in_child.py")
KEY = "router-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 20  # bound on each wait for a child (start-up of a Python process on a busy machine)


def stand_in(
    entry: CatalogEntry, port: int, inherited: Sequence[str], extra: Sequence[str]
) -> tuple[str, ...]:
    return (
        sys.executable,
        str(STAND_IN),
        "--port",
        str(port),
        "--served-model-name",
        entry.name,
        *inherited,
        *extra,
    )


def models_dir(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in names:
        (folder / f"{name}.gguf").write_bytes(b"GGUF")
    return folder


async def make_router(
    tmp_path: Path, *names: str, keyed: bool = True, **flags: str
) -> AsyncIterator[QuartTrio]:
    values = {"router__models_dir": str(models_dir(tmp_path, *names)), **flags}
    if keyed:
        values["server__api_key"] = KEY
    app = create_router_app(
        load_settings(values, environ={}),
        inherited=("--ctx-size=512",),
        environ=dict(os.environ),
        command=stand_in,
    )
    async with app.test_app() as test_app:
        yield test_app  # type: ignore[misc]


@pytest.fixture(name="router")
async def _router(tmp_path: Path) -> AsyncIterator[QuartTrio]:
    """A router over models a, b and broken, with an API key."""
    async for app in make_router(tmp_path, "a", "b", "broken"):
        yield app


def context(app: QuartTrio) -> RouterContext:
    return app.app.extensions[ROUTER_KEY]  # type: ignore[attr-defined,no-any-return]


async def settled(record: ModelRecord) -> Instance:
    """The record's instance once it is loaded or has ended (event-driven, bounded)."""
    instance = record.instance or record.last
    assert instance is not None
    with trio.fail_after(WAIT_S):
        await instance.settled.wait()
    return instance


async def exited(instance: Instance) -> None:
    with trio.fail_after(WAIT_S):
        await instance.exited.wait()


async def statuses(app: QuartTrio) -> dict[str, dict[str, Any]]:
    response = await app.test_client().get("/models", headers=AUTH)
    assert response.status_code == 200
    return {m["id"]: m["status"] for m in (await response.get_json())["data"]}


async def post(app: QuartTrio, path: str, body: dict[str, Any], query: str = "") -> Any:
    return await app.test_client().post(path + query, json=body, headers={**AUTH, "X-Request-Id": "req-42"})


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_a_child_runs_in_its_own_session(router: QuartTrio) -> None:
    """A Ctrl-C at the terminal (SIGINT to the router's process group) reaches the router alone.

    The router's drain is then the only signal a child gets: a second one would cut its running streams.
    """
    echo = await (await post(router, "/completion", {"model": "a"})).get_json()
    assert os.getsid(echo["pid"]) == echo["pid"]
    assert os.getpgid(echo["pid"]) != os.getpgrp()


def _bind(port: int) -> socket.socket:
    """A socket bound to *port* on loopback as another process would take a free port (address reuse on)."""
    taker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        taker.bind(("127.0.0.1", port))
    except OSError:
        taker.close()
        raise
    return taker


def _wait_until_dead(pid: int) -> None:
    """Block (bounded) until *pid* is a zombie: its files are closed, and this trio loop cannot reap it."""
    deadline = time.monotonic() + WAIT_S
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, f"process {pid} did not die"
        time.sleep(0.01)


async def test_a_child_s_port_stays_taken_until_the_router_has_seen_it_exit(router: QuartTrio) -> None:
    """The router binds each child's socket and hands it over, and holds its copy until the child is reaped.

    So no other local process can take the port while the router may send the child's key and prompts
    there: not before the child listens, not after it dies and before the router has noticed.
    """
    echo = await (await post(router, "/completion", {"model": "a"})).get_json()
    instance = context(router).registry.get("a").instance
    assert instance is not None
    assert echo["argv"][:2] == ["--port", str(instance.port)]
    os.kill(echo["pid"], signal.SIGKILL)
    _wait_until_dead(echo["pid"])  # no checkpoint: the router has not reaped it
    assert not instance.exited.is_set()
    with pytest.raises(OSError, match="in use") as taken:
        _bind(instance.port).close()
    assert taken.value.errno == errno.EADDRINUSE
    await exited(instance)
    _bind(instance.port).close()  # once the router has seen the exit, the port is free


class TestStatuses:
    async def test_unloaded_loading_loaded_unloaded(self, router: QuartTrio) -> None:
        """/models follows a model through POST /models/load and POST /models/unload."""
        assert (await statuses(router))["a"] == {"value": "unloaded"}
        response = await post(router, "/models/load", {"model": "a"})
        assert await response.get_json() == {"success": True}
        status = (await statuses(router))["a"]
        assert status["value"] == "loading"
        assert status["args"][-3:] == ["--served-model-name", "a", "--ctx-size=512"]
        instance = await settled(context(router).registry.get("a"))
        models = {
            m["id"]: m
            for m in (await (await router.test_client().get("/v1/models", headers=AUTH)).get_json())["data"]
        }
        assert models["a"]["status"]["value"] == "loaded"
        assert models["a"]["context_length"] == 99  # the child's own entry, merged
        assert (await post(router, "/models/unload", {"model": "a"})).status_code == 200
        await exited(instance)
        assert (await statuses(router))["a"] == {"value": "unloaded", "args": list(instance.args)}
        assert process_gone(instance.pid or 0)

    async def test_load_and_unload_refuse_what_makes_no_sense(self, router: QuartTrio) -> None:
        """Unknown model 404, loading a running one or unloading an unloaded one 400, extra_args off 400."""
        unknown = await post(router, "/models/load", {"model": "zzz"})
        assert unknown.status_code == 404
        assert (await unknown.get_json())["error"]["code"] == "model_not_found"
        not_loaded = await post(router, "/models/unload", {"model": "a"})
        assert (await not_loaded.get_json())["error"]["code"] == "model_not_loaded"
        extra = await post(router, "/models/load", {"model": "a", "extra_args": ["-c", "64"]})
        assert extra.status_code == 400
        assert (await extra.get_json())["error"]["param"] == "extra_args"
        await post(router, "/models/load", {"model": "a"})
        again = await post(router, "/models/load", {"model": "a"})
        assert (await again.get_json())["error"]["code"] == "model_already_loaded"

    async def test_bodies_are_parsed_off_the_event_loop(
        self, router: QuartTrio, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The router reads a body's ``model`` in a worker thread, small bodies too (issue 36 §3)."""
        threads: list[str] = []

        def noted(body: bytes) -> dict[str, Any]:
            threads.append(threading.current_thread().name)
            return parse_json_object(body)

        monkeypatch.setattr(routes, "parse_json_object", noted)
        await post(router, "/models/unload", {"model": "a"})
        await post(router, "/v1/chat/completions", {"model": "zzz", "messages": []})
        assert len(threads) == 2
        assert threading.main_thread().name not in threads

    async def test_a_model_that_cannot_load_is_failed_with_its_exit_code(self, router: QuartTrio) -> None:
        """A child that exits while loading: 503 model_failed, and unloaded/failed/exit_code in /models."""
        response = await post(router, "/v1/chat/completions", {"model": "broken", "messages": []})
        assert response.status_code == 503
        error = (await response.get_json())["error"]
        assert error["code"] == "model_failed"
        assert "status 3" in error["message"]
        status = (await statuses(router))["broken"]
        assert (status["value"], status["failed"], status["exit_code"]) == ("unloaded", True, 3)

    async def test_extra_args_reach_the_child_when_allowed(self, tmp_path: Path) -> None:
        """With --models-allow-extra-args, extra_args end the child's command line."""
        async for app in make_router(tmp_path, "a", router__models_allow_extra_args="on"):
            response = await post(app, "/models/load", {"model": "a", "extra_args": ["--temp=0.1"]})
            assert response.status_code == 200
            await settled(context(app).registry.get("a"))
            echo = await (await post(app, "/completion", {"model": "a"})).get_json()
            assert echo["argv"][-2:] == ["--ctx-size=512", "--temp=0.1"]

    async def test_extra_args_refuse_what_is_no_tuning_flag_and_load_nothing(self, tmp_path: Path) -> None:
        """A flag that names a file (here one /props would show) is a 400 naming it; no child starts."""
        async for app in make_router(tmp_path, "a", router__models_allow_extra_args="on"):
            secret = tmp_path / "secret.jinja"
            secret.write_text("{{ 'secret' }}")
            response = await post(
                app,
                "/models/load",
                {"model": "a", "extra_args": ["--temp", "0.1", f"--chat-template-file={secret}"]},
            )
            assert response.status_code == 400
            error = (await response.get_json())["error"]
            assert (error["param"], error["code"]) == ("extra_args[2]", "invalid_request")
            assert "--chat-template-file" in error["message"]
            assert context(app).registry.get("a").instance is None

    async def test_extra_args_ask_for_at_most_the_model_s_trained_context(self, tmp_path: Path) -> None:
        """--ctx-size in extra_args is capped by the model file's trained context (its card)."""
        folder = tmp_path / "real"
        folder.mkdir()
        (folder / "a.gguf").symlink_to(default_model_path())
        trained = read_model_card(default_model_path()).context_length
        app = create_router_app(
            load_settings(
                {"router__models_dir": str(folder), "router__models_allow_extra_args": "on"}, environ={}
            ),
            environ=dict(os.environ),
            command=stand_in,
        )
        async with app.test_app() as test_app:
            over = await post(
                test_app, "/models/load", {"model": "a", "extra_args": ["-c", str(trained + 1)]}
            )
            assert over.status_code == 400
            assert (await over.get_json())["error"]["param"] == "extra_args[0]"
            assert context(test_app).registry.get("a").instance is None
            within = await post(test_app, "/models/load", {"model": "a", "extra_args": ["-c", str(trained)]})
            assert within.status_code == 200
            await settled(context(test_app).registry.get("a"))
            echo = await (await post(test_app, "/completion", {"model": "a"})).get_json()
            assert echo["argv"][-2:] == ["-c", str(trained)]


class TestForwarding:
    async def test_post_goes_by_its_model_field_with_the_child_s_key_and_the_request_id(
        self, router: QuartTrio
    ) -> None:
        """The right child answers; it sees the router's key for it, not the client's, and the request id."""
        for model in ("a", "b"):
            response = await post(router, "/v1/chat/completions", {"model": model, "messages": []}, "?x=1")
            assert response.status_code == 200
            echo = await response.get_json()
            assert (echo["model"], echo["path"], echo["query"]) == (model, "/v1/chat/completions", "x=1")
            assert echo["body"] == {"model": model, "messages": []}
            assert echo["headers"]["x-request-id"] == "req-42"
            assert KEY not in echo["headers"]["authorization"]
            assert response.headers["X-Request-Id"] == "req-42"

    async def test_get_goes_by_its_model_query_or_to_the_one_loaded_model(self, router: QuartTrio) -> None:
        """?model= picks the child; without it, the one loaded model, and 400 when two are loaded."""
        client = router.test_client()
        echo = await (await client.get("/props?model=b", headers=AUTH)).get_json()
        assert (echo["model"], echo["path"]) == ("b", "/props")
        echo = await (await client.get("/slots", headers=AUTH)).get_json()
        assert echo["model"] == "b"
        await post(router, "/completion", {"model": "a"})
        ambiguous = await client.get("/slots", headers=AUTH)
        assert ambiguous.status_code == 400
        assert (await ambiguous.get_json())["error"]["code"] == "missing_model"
        own = await (await client.get("/props", headers=AUTH)).get_json()
        assert own["role"] == "router"

    async def test_errors_have_the_shape_of_the_path_s_dialect(self, router: QuartTrio) -> None:
        """Unknown model: 404 model_not_found, OpenAI's envelope or Anthropic's on /v1/messages."""
        openai = await post(router, "/v1/chat/completions", {"model": "zzz"})
        assert openai.status_code == 404
        assert (await openai.get_json())["error"]["code"] == "model_not_found"
        anthropic = await post(router, "/v1/messages", {"model": "zzz"})
        assert anthropic.status_code == 404
        body = await anthropic.get_json()
        assert (body["type"], body["error"]["type"], body["error"]["code"]) == (
            "error",
            "not_found_error",
            "model_not_found",
        )

    async def test_the_router_enforces_the_body_limit(self, tmp_path: Path) -> None:
        """--max-body-mib applies at the router: 413 in the dialect's shape, nothing loaded."""
        async for app in make_router(tmp_path, "a", server__max_body_mib="1"):
            big = {"model": "a", "prompt": "x" * (1024 * 1024)}
            response = await post(app, "/v1/messages", big)
            assert response.status_code == 413
            assert (await response.get_json())["error"]["type"] == "request_too_large"
            assert context(app).registry.get("a").instance is None

    async def test_the_router_checks_the_client_s_key(self, router: QuartTrio) -> None:
        """Without the router's key: 401 before anything is forwarded or loaded."""
        response = await router.test_client().post("/v1/chat/completions", json={"model": "a"})
        assert response.status_code == 401
        assert context(router).registry.get("a").instance is None

    async def test_debug_routes_are_forwarded_for_loopback_clients_only(self, router: QuartTrio) -> None:
        """/debug/* from another machine is the 404 of no such path, and reaches (and loads) no child.

        A child sees every request coming from the router's loopback address, so the router checks its
        own client's.
        """
        client = router.test_client()
        for peer in (("192.0.2.7", 50000), ("::ffff:192.0.2.7", 50000), None):
            far = await client.get("/debug/settings?model=a", headers=AUTH, scope_base={"client": peer})
            assert far.status_code == 404
            assert (await far.get_json())["error"]["code"] == "not_found"
            prompt = await client.post(
                "/debug/prompt", json={"model": "a"}, headers=AUTH, scope_base={"client": peer}
            )
            assert prompt.status_code == 404
        assert context(router).registry.get("a").instance is None
        for peer in (("127.0.0.1", 50000), ("::1", 50000)):
            near = await client.get("/debug/settings?model=a", headers=AUTH, scope_base={"client": peer})
            assert near.status_code == 200
            assert (await near.get_json())["path"] == "/debug/settings"

    async def test_no_static_folder_is_served(
        self, router: QuartTrio, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """GET /static/... is 404, even with a static/ folder where Quart's default would serve one."""
        root = tmp_path / "root"
        (root / "static").mkdir(parents=True)
        (root / "static" / "secret.txt").write_text("secret")
        monkeypatch.setattr(router.app, "root_path", str(root))  # type: ignore[attr-defined]
        response = await router.test_client().get("/static/secret.txt", headers=AUTH)
        assert response.status_code == 404
        assert context(router).registry.get("a").instance is None

    async def test_the_chat_page_is_the_router_s_own(self, router: QuartTrio) -> None:
        """/ and its files are served by the router, without the key, and load no model."""
        page = await router.test_client().get("/", headers={"Accept": "text/html"})
        assert page.status_code == 200
        assert "text/html" in page.headers["Content-Type"]
        script = await router.test_client().get("/webui/app.js")
        assert script.status_code == 200
        assert all(record.instance is None for record in context(router).registry.records.values())

    async def test_without_autoload_an_unloaded_model_is_400_unless_the_request_asks(
        self, tmp_path: Path
    ) -> None:
        """--no-models-autoload: 400 model_not_loaded; ?autoload=true loads it anyway."""
        async for app in make_router(tmp_path, "a", router__models_autoload="off"):
            refused = await post(app, "/completion", {"model": "a"})
            assert refused.status_code == 400
            assert (await refused.get_json())["error"]["code"] == "model_not_loaded"
            allowed = await post(app, "/completion", {"model": "a"}, "?autoload=true")
            assert (await allowed.get_json())["model"] == "a"

    async def test_models_max_unloads_the_least_recently_used(self, tmp_path: Path) -> None:
        """--models-max 1: a request for b stops a's child first."""
        async for app in make_router(tmp_path, "a", "b", router__models_max="1"):
            first = await (await post(app, "/completion", {"model": "a"})).get_json()
            await (await post(app, "/completion", {"model": "b"})).get_json()
            current = await statuses(app)
            assert (current["a"]["value"], current["b"]["value"]) == ("unloaded", "loaded")
            assert "failed" not in current["a"]
            assert process_gone(first["pid"])


@pytest.fixture(name="open_router")
async def _open_router(tmp_path: Path) -> AsyncIterator[QuartTrio]:
    """A router over model a without an API key (raw ASGI exchanges send none)."""
    async for app in make_router(tmp_path, "a", keyed=False):
        yield app


class TestStreams:
    async def test_the_first_event_arrives_while_the_child_still_works(
        self, open_router: QuartTrio, tmp_path: Path
    ) -> None:
        """Nothing is buffered: the first chunk reaches the client before the child sends the rest."""
        gate = tmp_path / "gate"
        body = {"model": "a", "stream": True, "gate": str(gate)}
        async with exchange(open_router.app, "/v1/chat/completions", json.dumps(body).encode()) as ex:
            first = await ex.receive_chunk()
            assert first == b'data: {"model": "a", "n": 0}\n\n'  # alone: the rest is not sent yet
            assert ex.status == 200
            gate.write_text("go")
            rest = await ex.read_all()
        assert rest.endswith(b"data: [DONE]\n\n")

    async def test_a_client_that_leaves_closes_the_child_s_stream(
        self, open_router: QuartTrio, tmp_path: Path
    ) -> None:
        """The router closes its connection to the child, which sees its client gone."""
        left = tmp_path / "left"
        body = {"model": "a", "stream": True, "chunks": 10_000, "pause": 0.005, "left": str(left)}
        async with exchange(open_router.app, "/v1/chat/completions", json.dumps(body).encode()) as ex:
            await ex.receive_chunk()
            await ex.receive_chunk()
            await ex.disconnect()
        with trio.fail_after(WAIT_S):
            while not left.exists():  # another process writes it
                await trio.sleep(0.01)

    @pytest.mark.parametrize(
        ("path", "event", "read"),
        [
            ("/v1/chat/completions", None, lambda data: data["error"]),
            ("/v1/messages", b"error", lambda data: data["error"]),
            ("/v1/responses", b"error", lambda data: data),
        ],
    )
    async def test_a_child_that_dies_mid_stream_ends_it_with_the_dialect_s_error_event(
        self, open_router: QuartTrio, path: str, event: bytes | None, read: Any
    ) -> None:
        """503 model_failed with the exit status, as the dialect's own error event ends a stream."""
        body = {"model": "a", "stream": True, "die": "during"}
        async with exchange(open_router.app, path, json.dumps(body).encode()) as ex:
            data = await ex.read_all()
        last = data.strip().split(b"\n\n")[-1].split(b"\n")
        if event is None:
            assert len(last) == 1
        else:
            assert last[0] == b"event: " + event
        error = read(json.loads(last[-1].removeprefix(b"data: ")))
        assert (error["code"], "status 3" in error["message"]) == ("model_failed", True)
        if path == "/v1/responses":
            assert error["sequence_number"] == 1  # the child had sent one event

    async def test_a_child_that_dies_mid_event_has_its_error_event_start_afresh(
        self, open_router: QuartTrio
    ) -> None:
        """The event the child cut off is ended, so the error event after it parses on its own."""
        body = {"model": "a", "stream": True, "die": "mid-event"}
        async with exchange(open_router.app, "/v1/chat/completions", json.dumps(body).encode()) as ex:
            data = await ex.read_all()
        events = data.split(b"\n\n")
        assert events[:2] == [b'data: {"model": "a", "n": 0}', b'data: {"n": ']
        assert events[-1] == b""
        error = json.loads(events[-2].removeprefix(b"data: "))["error"]
        assert error["code"] == "model_failed"

    async def test_a_child_that_dies_fails_its_request_and_the_next_reloads_it(
        self, router: QuartTrio
    ) -> None:
        """503 model_failed (Anthropic's shape on /v1/messages), failed in /models, then a fresh child."""
        first = await (await post(router, "/completion", {"model": "a"})).get_json()
        died = await post(router, "/v1/messages", {"model": "a", "die": "before"})
        assert died.status_code == 503
        body = await died.get_json()
        assert (body["error"]["type"], body["error"]["code"]) == ("overloaded_error", "model_failed")
        status = (await statuses(router))["a"]
        assert (status["failed"], status["exit_code"]) == (True, 3)
        again = await (await post(router, "/completion", {"model": "a"})).get_json()
        assert again["model"] == "a"
        assert again["pid"] != first["pid"]


async def test_a_proxy_in_the_environment_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router talks to its children on loopback and to nothing else, whatever HTTP_PROXY says."""
    with Listener() as listener:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, listener.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async for app in make_router(tmp_path, "a"):
            response = await post(app, "/v1/chat/completions", {"model": "a", "messages": []})
            assert response.status_code == 200
        assert listener.connections == 0


async def test_a_drain_lets_running_streams_finish_and_refuses_new_requests(
    open_router: QuartTrio, tmp_path: Path
) -> None:
    """On SIGTERM the children drain while the router forwards their last bytes; newcomers get 503."""
    gate = tmp_path / "gate"
    body = {"model": "a", "stream": True, "gate": str(gate)}
    async with exchange(open_router.app, "/v1/chat/completions", json.dumps(body).encode()) as ex:
        await ex.receive_chunk()
        instance = context(open_router).registry.get("a").instance
        assert instance is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, open_router.app, 5.0)
            await trio.testing.wait_all_tasks_blocked()
            refused = await open_router.test_client().post("/completion", json={"model": "a"})
            assert refused.status_code == 503
            assert (await refused.get_json())["error"]["code"] == "not_ready"
            assert (await open_router.test_client().get("/ready")).status_code == 503
            gate.write_text("go")
            rest = await ex.read_all()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert instance.exited.is_set()
    assert not instance.failed
    assert process_gone(instance.pid or 0)


async def test_while_draining_the_router_is_unready_and_still_forwards(router: QuartTrio) -> None:
    """--drain-delay: /ready turns 503 "stopping" while requests still reach the children."""
    start_draining(router.app)
    ready = await router.test_client().get("/ready", headers=AUTH)
    assert ready.status_code == 503
    assert (await ready.get_json())["status"] == "stopping"
    assert (await post(router, "/completion", {"model": "a"})).status_code == 200


async def test_shutdown_leaves_no_child_behind(tmp_path: Path) -> None:
    """Leaving the app's lifespan stops every child; their PIDs are gone."""
    pids: list[int] = []
    async for app in make_router(tmp_path, "a", "b"):
        for model in ("a", "b"):
            echo = await (await post(app, "/completion", {"model": model})).get_json()
            pids.append(echo["pid"])
        assert not any(process_gone(pid) for pid in pids)
    assert all(process_gone(pid) for pid in pids)


async def test_the_router_keeps_the_browser_boundary(router: QuartTrio) -> None:
    """Another origin, an <img> of a router route, a rebound Host: 403 at the router, nothing loaded; an
    allowed origin's request reaches the child without Origin and Sec-Fetch-Site (the router decided)."""
    client = router.test_client()
    loopback = {"server": ("127.0.0.1", 8080)}
    refused = [
        await client.post(
            "/models/load", json={"model": "a"}, headers={**AUTH, "Origin": "http://evil.example"}
        ),
        await client.get(
            "/models?reload=1", headers={**AUTH, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
        ),
        await client.post(
            "/v1/chat/completions",
            json={"model": "a", "messages": []},
            headers={**AUTH, "Host": "rebind.test"},
            scope_base=loopback,
        ),
    ]
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert all(record.instance is None for record in context(router).registry.records.values())
    allowed = await client.post(
        "/v1/chat/completions",
        json={"model": "a", "messages": []},
        headers={**AUTH, "Origin": "http://localhost:5173", "Sec-Fetch-Site": "same-site"},
        scope_base=loopback,
    )
    assert allowed.status_code == 200
    forwarded = (await allowed.get_json())["headers"]
    assert "origin" not in forwarded
    assert "sec-fetch-site" not in forwarded
