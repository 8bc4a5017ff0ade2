"""A hostile page in a real Chromium against a real `bubo serve`: everything it tries is refused by Bubo.

The page comes from a second HTTP server on another port, reached as
``http://attacker.test:PORT`` (Chromium's ``--host-resolver-rules`` maps the
name to 127.0.0.1, so the page sits on this machine, as a page rebinding its
name would, and the browser's own local-network rules do not step in).  It
tries ``fetch`` in ``cors`` and ``no-cors`` modes, a ``<form>`` POST with
``text/plain`` and an ``<img>`` GET; a page at ``http://rebind.test:PORT``
(Bubo's port) makes same-origin requests that reach Bubo with that Host, as
after DNS rebinding.  Each is refused by Bubo (its log line counts them), no
generation runs, the model stays loaded; the chat page at ``/`` still chats
from every loopback name.  docs/security.md, "The browser boundary".
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect, sync_playwright

from ._webui import (  # noqa: F401 - the shared fixtures
    _artifacts,
    _errors,
    _page,
    _profile,
    ask,
    chromium_path,
    set_setting,
    wait_ready,
)
from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

REFUSED = re.compile(r"refused (?:GET|HEAD|POST|OPTIONS) '")  # Bubo's log line for each refusal
COUNTERS = ("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total")
CHAT = '{"model": "bubo", "messages": [{"role": "user", "content": "Say yes"}], "max_tokens": 4}'
ATTACK_PAGE = b"""<!doctype html><title>a page on another site</title>
<iframe name="sink" id="sink"></iframe>"""


@pytest.fixture(name="bubo", scope="module")
def _bubo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`bubo serve` on 127.0.0.1 and ::1, no key, its defaults otherwise."""
    port = free_port()
    server = start_server(
        [bubo_command(), "serve", "--port", str(port), "--host", "127.0.0.1,::1"],
        port,
        tmp_path_factory.mktemp("cross-origin") / "serve.log",
    )
    yield server
    assert stop_server(server) == 0


class _AttackHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(ATTACK_PAGE)))
        self.end_headers()
        self.wfile.write(ATTACK_PAGE)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        """Quiet."""


@pytest.fixture(name="attacker", scope="module")
def _attacker() -> Iterator[str]:
    """Another local HTTP server (127.0.0.1, its own port) serving the hostile page; its URL by name."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _AttackHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://attacker.test:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(name="browser", scope="module")
def _browser() -> Iterator[Browser]:
    """Chromium resolving attacker.test and rebind.test to 127.0.0.1 (what an attacker's DNS would do).

    Without Chromium's local-network checks, as in browsers that have none:
    what is tested is Bubo's refusal, not the browser's.
    """
    args = [
        "--no-sandbox",
        "--host-resolver-rules=MAP attacker.test 127.0.0.1, MAP rebind.test 127.0.0.1",
        "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests",
    ]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=args)
        yield browser
        browser.close()


def refusals(server: Server) -> int:
    return len(REFUSED.findall(server.output()))


def wait_refusals(server: Server, count: int) -> None:
    """Until Bubo has logged *count* refusals (at most 30 s): the browser did send the request."""
    deadline = time.monotonic() + 30
    while refusals(server) < count:
        assert time.monotonic() < deadline, f"Bubo logged {refusals(server)} refusals, not {count}"
        time.sleep(0.05)


def generation_counters(server: Server) -> dict[str, str]:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return {line.split()[0]: line.split()[1] for line in text.splitlines() if line.startswith(COUNTERS)}


def test_another_site_cannot_drive_or_read_bubo(profile: BrowserContext, bubo: Server, attacker: str) -> None:
    """fetch (cors, no-cors), a text/plain form and an <img>: each refused by Bubo, nothing generated."""
    before = generation_counters(bubo)
    attack = profile.new_page()  # not watched: its failed loads are the point
    attack.goto(attacker)
    target = bubo.base_url
    seen = refusals(bubo)

    outcomes = attack.evaluate(
        """async ([target, chat]) => {
          const cors = async (init) => {
            try { const r = await fetch(target + '/v1/chat/completions', init); return 'read ' + r.status; }
            catch (e) { return 'failed'; }
          };
          return [
            await cors({method: 'POST', mode: 'cors', headers: {'Content-Type': 'application/json'}, body: chat}),
            await cors({method: 'POST', mode: 'cors', headers: {'Content-Type': 'text/plain'}, body: chat}),
            await cors({method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: chat}),
            await (async () => {
              try { const r = await fetch(target + '/props', {mode: 'cors'}); return 'read ' + (await r.text()); }
              catch (e) { return 'failed'; }
            })(),
          ];
        }""",
        [target, CHAT],
    )
    # the browser lets the page read nothing; Bubo refused each request it received (a preflight for the
    # JSON one, whose POST the browser then never sent)
    assert outcomes[:2] == ["failed", "failed"]
    assert outcomes[2] in ("read 0", "failed")  # an opaque response: no status, no body
    assert outcomes[3] == "failed"
    wait_refusals(bubo, seen + 4)

    seen = refusals(bubo)
    attack.evaluate(
        """([target, chat]) => {
          const form = document.createElement('form');
          form.method = 'POST';
          form.enctype = 'text/plain';
          form.action = target + '/v1/chat/completions';
          form.target = 'sink';
          const field = document.createElement('input');
          field.name = chat.slice(0, -1) + ', "x": "';  // name=value makes JSON: {..., "x": "=1"}
          field.value = '1"}';
          form.appendChild(field);
          document.body.appendChild(form);
          form.submit();
        }""",
        [target, CHAT],
    )
    wait_refusals(bubo, seen + 1)

    seen = refusals(bubo)
    loaded = attack.evaluate(
        """(url) => new Promise((resolve) => {
          const image = new Image();
          image.onload = () => resolve('loaded');
          image.onerror = () => resolve('error');
          image.src = url;
        })""",
        target + "/slots",
    )
    assert loaded == "error"
    wait_refusals(bubo, seen + 1)

    assert generation_counters(bubo) == before  # no generation ran
    assert httpx.get(bubo.base_url + "/health", timeout=10).json()["status"] == "ok"  # the model is loaded


def test_a_rebound_name_reads_nothing(profile: BrowserContext, bubo: Server) -> None:
    """A page at rebind.test:PORT (Bubo's port) whose requests reach Bubo: its same-origin reads get 403."""
    port = bubo.base_url.rsplit(":", 1)[1]
    origin = f"http://rebind.test:{port}"
    before = generation_counters(bubo)

    def serve_attack(route: Route) -> None:  # the page came from the attacker's server, before the rebinding
        route.fulfill(status=200, content_type="text/html", body="<!doctype html><title>rebound</title>")

    attack = profile.new_page()
    attack.route(origin + "/start", serve_attack)
    attack.goto(origin + "/start")
    seen = refusals(bubo)
    outcomes = attack.evaluate(
        """async (chat) => {
          const read = async (path, init) => { const r = await fetch(path, init); return [r.status, await r.text()]; };
          return [
            await read('/props'),
            await read('/slots'),
            await read('/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: chat}),
          ];
        }""",
        CHAT,
    )
    assert [status for status, _body in outcomes] == [403, 403, 403]
    assert all("host_not_allowed" in body and "smollm2" not in body for _status, body in outcomes)
    wait_refusals(bubo, seen + 3)
    assert generation_counters(bubo) == before
    assert "--allowed-hosts rebind.test" in bubo.output()


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "[::1]"])
def test_the_chat_page_chats_from_every_loopback_name(
    page: Page, bubo: Server, name: str, artifacts: Path
) -> None:
    """The page at http://NAME:PORT/ loads, asks and gets its answer (its requests carry its own Origin)."""
    port = bubo.base_url.rsplit(":", 1)[1]
    statuses: list[int] = []
    page.on(
        "response", lambda r: statuses.append(r.status) if r.url.endswith("/v1/chat/completions") else None
    )
    seen = refusals(bubo)
    page.goto(f"http://{name}:{port}/")
    wait_ready(page)
    set_setting(page, "max_tokens", "8")  # a short answer: each name is an origin with settings of its own
    ask(page, "Say hello")
    expect(page.locator("article.assistant .content").last).not_to_be_empty()
    assert statuses == [200]
    assert refusals(bubo) == seen
    page.screenshot(path=artifacts / f"cross-origin-chat-{name.strip('[]').replace(':', '-')}.png")
