"""The chat page at ``/``: served from the package, self-contained, without the key, off on request.

What the page does in a browser is tested with a real Chromium in tests/e2e/test_webui_browser.py.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import trio

from bubo.api import webui
from bubo.config import load_settings, serve_flag_values
from bubo.server import create_app

from ..conftest import wait_until_ready

ASSET_PATHS = ["/", *(f"/webui/{name}" for name in webui.ASSETS)]
BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}  # what a browser asks / for
LAZY = (
    "vendor/highlight/",
    "vendor/katex/",
    "vendor/pdfjs/",
)  # loaded the first time code, math or a PDF needs them
MODULES = (
    "app.js",
    "api.js",
    "attachments.js",
    "dom.js",
    "markdown.js",
    "samplers.js",
    "settings.js",
    "store.js",
    "tree.js",
    "view.js",
)


@pytest.fixture(name="make_app")
def _make_app(make_runtime):
    def make(flags: dict[str, str]):
        settings = load_settings(flags, environ={})
        return create_app(settings, load=lambda _s, _p: make_runtime(), on_load_failure=lambda: None)

    return make


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline_script = ""
        self._in_script = False

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag) -> None:
        self._in_script = False

    def handle_data(self, data) -> None:
        if self._in_script:
            self.inline_script += data


class TestPage:
    @pytest.mark.parametrize("path", ASSET_PATHS)
    async def test_each_file_is_served_with_a_self_only_policy(self, app, path) -> None:
        """Each file of the page comes from the package, with a CSP that allows this origin alone."""
        response = await app.test_client().get(path, headers=BROWSER)
        assert response.status_code == 200
        policy = response.headers["Content-Security-Policy"]
        assert "script-src 'self';" in policy
        assert "connect-src 'self';" in policy
        assert "unsafe-inline" not in policy
        assert "unsafe-eval" not in policy
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"

    async def test_the_page_has_no_inline_script_and_loads_nothing_from_elsewhere(self, app) -> None:
        """Every script and stylesheet is one of the page's own files: it works offline, under the CSP."""
        html = (await (await app.test_client().get("/", headers=BROWSER)).get_data()).decode()
        parser = _Tags()
        parser.feed(html)
        assert parser.inline_script.strip() == ""
        references = [a.get("src") or a.get("href") for t, a in parser.tags if t in ("script", "link")]
        assert references
        for reference in references:
            assert reference is not None
            assert reference.startswith("/webui/")
            assert (await app.test_client().get(reference)).status_code == 200
        assert not any(re.match(r"on[a-z]+$", name) for _t, a in parser.tags for name in a)  # no handlers

    async def test_the_page_is_served_while_the_model_loads(self, make_runtime) -> None:
        """First paint waits for no model: the page answers while the API still says 503 not_ready."""
        release = trio.Event()

        def slow_load(_settings, _progress):
            trio.from_thread.run(release.wait)
            return make_runtime()

        app = create_app(load_settings({}, environ={}), load=slow_load, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            client = test_app.test_client()
            for path in ASSET_PATHS:
                assert (await client.get(path, headers=BROWSER)).status_code == 200, path
            assert (await client.get("/v1/models")).status_code == 503
            release.set()
            await wait_until_ready(app)

    def test_the_first_paint_weighs_under_300_kb(self) -> None:
        """Everything the browser downloads before the first answer, uncompressed (docs/webui.md states it)."""
        first = [body for name, body in webui.ASSETS.items() if not name.startswith(LAZY)]
        assert sum(map(len, first)) < 300 * 1024
        assert sum(map(len, webui.ASSETS.values())) < 3 * 1024 * 1024  # with every lazily loaded library

    @pytest.mark.parametrize(("name", "content_type"), [("vendor/pdfjs/pdf.min.mjs", "text/javascript; charset=utf-8"),
                             ("vendor/katex/fonts/KaTeX_Main-Regular.woff2", "font/woff2")])  # fmt: skip
    async def test_modules_and_fonts_have_their_types(self, app, name, content_type) -> None:
        """An ES module is JavaScript to the browser (it refuses a module of another type), a font a font."""
        response = await app.test_client().get(f"/webui/{name}")
        assert response.status_code == 200
        assert response.headers["Content-Type"] == content_type

    async def test_an_unknown_file_is_404(self, app) -> None:
        response = await app.test_client().get("/webui/secret.txt")
        assert response.status_code == 404
        assert (await response.get_json())["error"]["code"] == "not_found"

    async def test_the_model_text_is_sanitized_before_it_becomes_html(self) -> None:
        """The two places model text becomes HTML go through DOMPurify (the browser tests run them)."""
        for name in MODULES:
            if name != "markdown.js":
                assert ".innerHTML" not in webui.ASSETS[name].decode(), name
        script = webui.ASSETS["markdown.js"].decode()
        assert script.count(".innerHTML =") == 2
        assert "container.innerHTML = html;" in script  # html from parse(): purifier.sanitize(...)
        assert "return { html: purifier.sanitize(html, SANITIZE), slots };" in script
        assert "node.innerHTML = highlightPurifier.sanitize(html, HIGHLIGHTED);" in script


class TestSwitch:
    @pytest.mark.parametrize(
        ("argv", "environ", "served"),
        [
            ([], {}, True),
            (["--webui", "off"], {}, False),
            (["--no-webui"], {"BUBO_WEBUI": "on"}, False),  # the flag wins over the variable
            ([], {"BUBO_WEBUI": "off"}, False),
            (["--webui"], {"BUBO_WEBUI": "off"}, True),
        ],
    )
    def test_flags_and_variable(self, argv, environ, served) -> None:
        assert load_settings(serve_flag_values(argv), environ=environ).server.webui is served

    @pytest.mark.parametrize("path", ["/webui/app.js", "/webui/index.html"])
    async def test_off_means_404(self, make_app, path) -> None:
        """With --no-webui the page's files do not exist (``/`` then answers as Ollama does: test_ollama)."""
        app = make_app({"server__webui": "off"})
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            response = await test_app.test_client().get(path)
            assert response.status_code == 404
            assert (await response.get_json())["error"]["code"] == "not_found"


class TestApiKey:
    async def test_the_files_need_no_key_and_the_api_still_does(self, make_app) -> None:
        """The page's files hold nothing secret and load without the key; every API call needs it."""
        app = make_app({"server__api_key": "s3cret"})
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            client = test_app.test_client()
            for path in ASSET_PATHS:
                assert (await client.get(path, headers=BROWSER)).status_code == 200, path
            for path in ("/v1/models", "/props", "/slots", "/index.html", "/webuix"):
                assert (await client.get(path)).status_code == 401, path
            assert (await client.post("/v1/chat/completions", json={})).status_code == 401
            models = await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
            assert models.status_code == 200


async def test_no_static_folder_is_served(make_app, tmp_path, monkeypatch) -> None:
    """GET /static/... is 404, even with a static/ folder where Quart's default would serve one.

    The page's files are served by webui.py, from the package, on purpose; nothing else is.
    """
    root = tmp_path / "root"
    (root / "static").mkdir(parents=True)
    (root / "static" / "secret.txt").write_text("secret")
    app = make_app({})
    monkeypatch.setattr(app, "root_path", str(root))
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        response = await test_app.test_client().get("/static/secret.txt")
        assert response.status_code == 404
        assert (await test_app.test_client().get("/webui/app.js")).status_code == 200
