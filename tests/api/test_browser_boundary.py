"""The browser boundary over the app: what a web page sends is refused before the key and the body.

docs/security.md, "The browser boundary": a request from another origin, or
for a name that is not loopback on a loopback address, is a 403 in the
route's dialect, refused before the API key is looked at and before its body
is read; curl, SDKs and the chat page's own requests are served as before.
"""

from __future__ import annotations

import json

import attrs
import pytest
import trio
from tests._asgi import exchange
from tests.conftest import wait_until_ready

from bubo.config import Settings
from bubo.engine.fake import FakeEngine
from bubo.server import create_app

CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
EVIL = "http://evil.example"
LAN = ("192.168.1.20", 8080)


LOOPBACK = {"server": ("127.0.0.1", 8080)}  # the address the request reached (the test client sets none)


@pytest.fixture(name="custom_app")
async def _custom_app(settings: Settings, make_runtime, request):
    """The app over the fake engine, with the server settings of the test's parameter changed."""
    app = create_app(
        attrs.evolve(settings, server=attrs.evolve(settings.server, **request.param)),
        load=lambda _s, _p: make_runtime(),
        on_load_failure=lambda: None,
    )
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


class TestOrigin:
    async def test_text_plain_post_from_another_origin(self, app, fake_engine: FakeEngine) -> None:
        """A no-cors fetch or a text/plain form: 403 in OpenAI's envelope, nothing generated, connection closed."""
        response = await app.test_client().post(
            "/v1/chat/completions",
            data=json.dumps(CHAT),
            headers={"Origin": EVIL, "Content-Type": "text/plain;charset=UTF-8"},
        )
        assert response.status_code == 403
        body = await response.get_json()
        assert body["error"]["type"] == "permission_error"
        assert body["error"]["code"] == "origin_not_allowed"
        assert "--cors-origins" in body["error"]["message"]
        assert response.headers["Connection"] == "close"
        assert "Access-Control-Allow-Origin" not in response.headers
        assert fake_engine.requests == []

    @pytest.mark.parametrize(
        ("path", "shape"),
        [
            ("/api/chat", lambda body: body["error"]),
            ("/v1/messages", lambda body: body["error"]["type"] == "permission_error" and body["request_id"]),
            ("/completion", lambda body: body["error"]["code"] == "origin_not_allowed"),
        ],
    )
    async def test_each_dialect_shapes_its_refusal(self, app, fake_engine: FakeEngine, path, shape) -> None:
        """Ollama's {"error": "..."}, Anthropic's permission_error, llama-server's envelope."""
        response = await app.test_client().post(path, json=CHAT | {"prompt": "x"}, headers={"Origin": EVIL})
        assert response.status_code == 403
        assert shape(await response.get_json())
        assert fake_engine.requests == []

    @pytest.mark.parametrize("path", ["/props", "/slots", "/v1/models", "/metrics", "/", "/no/such/route"])
    async def test_reads_are_refused_too(self, app, path: str) -> None:
        """GET from another origin (an <img>, a no-cors fetch) is refused on every route."""
        response = await app.test_client().get(path, headers={"Origin": EVIL})
        assert response.status_code == 403

    @pytest.mark.parametrize("custom_app", [{"api_key": "k"}], indirect=True)
    async def test_before_the_api_key(self, custom_app, fake_engine: FakeEngine) -> None:
        """With --api-key the refusal is the same, with the right key or none: the key is no defence."""
        client = custom_app.test_client()
        for headers in ({"Origin": EVIL}, {"Origin": EVIL, "Authorization": "Bearer k"}):
            response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 403
            assert (await response.get_json())["error"]["code"] == "origin_not_allowed"
        assert fake_engine.requests == []

    async def test_own_origin_and_default_origins_are_served(self, app, fake_engine: FakeEngine) -> None:
        """The chat page (its Origin is the Host) and an editor's webview (Ollama's defaults) generate."""
        client = app.test_client()
        for origin, host in (
            ("http://localhost:8080", "localhost:8080"),
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://[::1]:8080", "[::1]:8080"),
            ("vscode-webview://abc", "127.0.0.1:8080"),
        ):
            response = await client.post(
                "/v1/chat/completions", json=CHAT, headers={"Origin": origin, "Host": host}
            )
            assert response.status_code == 200, origin
        assert len(fake_engine.requests) == 4

    async def test_curl_form_content_type_is_served(self, app, fake_engine: FakeEngine) -> None:
        """curl -d sends application/x-www-form-urlencoded and no Origin: served, as by llama-server."""
        response = await app.test_client().post(
            "/completion",
            data=json.dumps({"prompt": "x", "n_predict": 2}),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert response.status_code == 200
        assert len(fake_engine.requests) == 1

    async def test_cross_site_post_without_origin(self, app, fake_engine: FakeEngine) -> None:
        """Sec-Fetch-Site: cross-site on a POST without an allowed Origin is refused."""
        response = await app.test_client().post(
            "/v1/chat/completions", json=CHAT, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert response.status_code == 403
        assert fake_engine.requests == []

    async def test_null_origin(self, app) -> None:
        """A sandboxed frame's Origin: null is refused."""
        response = await app.test_client().post("/v1/chat/completions", json=CHAT, headers={"Origin": "null"})
        assert response.status_code == 403
        assert "opaque origin" in (await response.get_json())["error"]["message"]


class TestPreflight:
    @pytest.mark.parametrize("custom_app", [{"cors_origins": ("https://app.example",)}], indirect=True)
    async def test_allowed_preflight_gets_allow_headers(self, custom_app) -> None:
        """--cors-origins' origin: its preflight is answered with the allow headers, as before."""
        response = await custom_app.test_client().options(
            "/v1/chat/completions",
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert response.status_code == 200
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"

    @pytest.mark.parametrize("custom_app", [{"cors_origins": ("https://app.example",)}], indirect=True)
    async def test_other_preflight_gets_none(self, custom_app) -> None:
        """Another origin's preflight is a 403 without allow headers."""
        response = await custom_app.test_client().options(
            "/v1/chat/completions", headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"}
        )
        assert response.status_code == 403
        allowing = [
            name for name, _value in response.headers.items() if name.startswith("Access-Control-Allow")
        ]
        assert not allowing

    @pytest.mark.parametrize("origin", ["vscode-webview://1a2b3c", "tauri://localhost", "app://-"])
    async def test_an_editor_or_desktop_front_end_reads_its_answers(self, app, origin: str) -> None:
        """Ollama's default app origins get CORS answers without --cors-origins: their preflight and reply."""
        client = app.test_client()
        preflight = await client.options(
            "/api/chat", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.headers["Access-Control-Allow-Origin"] == origin
        response = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})
        assert response.status_code == 200
        assert response.headers["Access-Control-Allow-Origin"] == origin

    async def test_a_local_web_page_is_served_but_reads_nothing_by_default(self, app) -> None:
        """A page on another localhost port is admitted (Ollama's default) but gets no CORS answer
        without --cors-origins localhost, so its script cannot read the reply."""
        response = await app.test_client().post(
            "/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:5173"}
        )
        assert response.status_code == 200
        assert "Access-Control-Allow-Origin" not in response.headers


class TestHost:
    async def test_rebound_name_is_refused(self, app) -> None:
        """GET /props with Host rebind.test: 403 naming --allowed-hosts, whatever the Origin (here: its own)."""
        client = app.test_client()
        for headers in (
            {"Host": "rebind.test:8080"},
            {"Host": "rebind.test:8080", "Origin": "http://rebind.test:8080"},
        ):
            response = await client.get("/props", headers=headers, scope_base=LOOPBACK)
            assert response.status_code == 403
            body = await response.get_json()
            assert body["error"]["code"] == "host_not_allowed"
            assert "--allowed-hosts rebind.test" in body["error"]["message"]

    @pytest.mark.parametrize("custom_app", [{"api_key": "k"}], indirect=True)
    async def test_with_api_key(self, custom_app) -> None:
        """With --api-key and the right key, a rebound name is still refused."""
        response = await custom_app.test_client().get(
            "/props", headers={"Host": "rebind.test", "Authorization": "Bearer k"}, scope_base=LOOPBACK
        )
        assert response.status_code == 403

    @pytest.mark.parametrize("host", ["localhost:8080", "127.0.0.1:8080", "[::1]:8080"])
    async def test_chat_page_from_every_loopback_name(self, app, host: str) -> None:
        """The chat page and its files load from each loopback name."""
        client = app.test_client()
        page = await client.get("/", headers={"Host": host, "Accept": "text/html"}, scope_base=LOOPBACK)
        assert page.status_code == 200
        assert "text/html" in page.headers["Content-Type"]

    @pytest.mark.parametrize("custom_app", [{"allowed_hosts": ("llm.example.com",)}], indirect=True)
    async def test_allowed_hosts(self, custom_app) -> None:
        """--allowed-hosts admits its names, and only those."""
        client = custom_app.test_client()
        response = await client.get("/props", headers={"Host": "llm.example.com"}, scope_base=LOOPBACK)
        assert response.status_code == 200
        response = await client.get("/props", headers={"Host": "other.example.com"}, scope_base=LOOPBACK)
        assert response.status_code == 403

    @pytest.mark.parametrize("custom_app", [{"allowed_hosts": ("*",)}], indirect=True)
    async def test_any_host(self, custom_app) -> None:
        """--allowed-hosts * turns the check off."""
        response = await custom_app.test_client().get(
            "/props", headers={"Host": "rebind.test"}, scope_base=LOOPBACK
        )
        assert response.status_code == 200

    async def test_not_on_a_non_loopback_address(self, app) -> None:
        """A request that reached a LAN address is served under any name (the operator bound it there)."""
        response = await app.test_client().get(
            "/props", headers={"Host": "llm.example.com"}, scope_base={"server": LAN}
        )
        assert response.status_code == 200


async def test_the_body_is_not_read(app, fake_engine: FakeEngine) -> None:
    """A refused upload that never ends is answered at once, without waiting for (or reading) its body."""
    headers = [(b"origin", EVIL.encode()), (b"content-length", b"33554432")]
    with trio.fail_after(10):
        async with exchange(
            app.app, "/v1/chat/completions", b"x" * 65536, headers=headers, more_body=True
        ) as connection:
            await connection.read_all()
            assert connection.status == 403
            assert connection.headers["connection"] == "close"
            await connection.disconnect()
    assert fake_engine.requests == []
