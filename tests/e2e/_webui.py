"""What the chat page's browser tests share: the browser, a fresh profile per test, and page helpers.

The browser is Debian's ``chromium`` (``apt-get install chromium``; ``nox -s tests`` installs it), found on
PATH or at ``$BUBO_CHROMIUM``, driven through Playwright's Python API with ``executable_path``: no
browser download.  A missing browser fails the run.  Screenshots land in ``test-artifacts/webui/`` (or
``$BUBO_TEST_ARTIFACTS/webui/``); the run prints where.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from .conftest import Server

ROOT = Path(__file__).resolve().parents[2]
# How long the page may take for what the model does (a whole answer on two busy cores), not a latency claim.
ANSWER_MS = 120_000
# Playwright's 5 s default for each expectation is short for a server and a browser sharing two busy cores.
expect.set_options(timeout=30_000)
TOKEN_COUNT = re.compile(r"[1-9]\d* / 2048 tokens")  # the draft counted against the context
# Requests the tests make fail on purpose, and pdf.js's note that it draws no glyphs (it only reads text).
EXPECTED_CONSOLE = ("status of 400", "status of 401", "status of 503", "standardFontDataUrl")


def chromium_path() -> str:
    found = os.environ.get("BUBO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(
            "no Chromium: the web UI's browser tests need Debian's chromium package "
            "(apt-get install chromium) or BUBO_CHROMIUM=/path/to/chrome",
            pytrace=False,
        )
    return found


@pytest.fixture(name="artifacts", scope="module")
def _artifacts(request: pytest.FixtureRequest) -> Path:
    folder = Path(os.environ.get("BUBO_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "webui"
    folder.mkdir(parents=True, exist_ok=True)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\nweb UI screenshots: {folder}")  # noqa: T201 - where to look, even when the run passes
    return folder


@pytest.fixture(name="browser", scope="module")  # one Playwright at a time: each test file starts its own
def _browser() -> Iterator[Browser]:
    executable = chromium_path()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(name="errors")
def _errors() -> list[str]:
    """The page's script errors and failed loads; a test removes those it causes on purpose."""
    return []


def watch(page: Page, errors: list[str]) -> Page:
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    return page


@pytest.fixture(name="profile")
def _profile(browser: Browser, errors: list[str]) -> Iterator[BrowserContext]:
    """A fresh browser profile (empty storage) with a desktop-sized window; page errors fail the test."""
    context = browser.new_context(viewport={"width": 1100, "height": 720})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    yield context
    context.close()
    unexpected = [e for e in errors if not any(r in e for r in EXPECTED_CONSOLE)]
    assert not unexpected, "\n".join(unexpected)


@pytest.fixture(name="page")
def _page(profile: BrowserContext, errors: list[str]) -> Page:
    return watch(profile.new_page(), errors)


def open_page(page: Page, server: Server) -> None:
    page.goto(server.base_url + "/")
    wait_ready(page)


def wait_ready(page: Page) -> None:
    """Until the page has read /props (it shows the model's context)."""
    expect(page.locator("#model")).to_contain_text("tokens context", timeout=30_000)


def set_setting(page: Page, key: str, value: str) -> None:
    """Fill one field of the settings dialog (by its request field name) and close the dialog."""
    page.click("#open-settings")
    field = page.locator(f"#setting-{key}")
    if field.evaluate("node => node.tagName") == "SELECT":
        field.select_option(value)
    else:
        field.fill(value)
    page.click("#settings-close")


def answers(page: Page) -> int:
    """How many requests for an answer the page has ended (finished, stopped or failed)."""
    return int(page.locator("#messages").get_attribute("data-answers") or 0)


@contextlib.contextmanager
def answered(page: Page, count: int = 1) -> Iterator[None]:
    """Wait, after the block, until *count* more answers have ended."""
    before = answers(page)
    yield
    expect(page.locator("#messages")).to_have_attribute(
        "data-answers", str(before + count), timeout=ANSWER_MS
    )


def ask(page: Page, text: str) -> None:
    """Type *text*, press Enter and wait until its answer has ended."""
    with answered(page):
        page.fill("#draft", text)
        page.press("#draft", "Enter")


def store_conversations(page: Page, conversations: list[list[dict[str, Any]]]) -> None:
    """Write conversations (each a list of messages, one path) to the page's IndexedDB, as an earlier visit would."""
    page.evaluate(
        """async (conversations) => {
          const db = await new Promise((resolve, reject) => {
            const request = indexedDB.open('bubo', 1);
            request.onsuccess = () => resolve(request.result);
            request.onerror = () => reject(request.error);
          });
          const t = db.transaction(['conversations', 'messages'], 'readwrite');
          conversations.forEach((messages, i) => {
            let parent = null;
            messages.forEach((m, j) => {
              const id = `m${i}-${j}`;
              t.objectStore('messages').put({...m, id, conversation: `c${i}`, parent, created: j + 1});
              parent = id;
            });
            t.objectStore('conversations').put({id: `c${i}`, title: messages[0] ? messages[0].content.slice(0, 48) : '',
              leaf: parent, system: '', created: i, updated: 100 - i});
          });
          await new Promise((resolve, reject) => { t.oncomplete = resolve; t.onerror = () => reject(t.error); });
          db.close();
          localStorage.setItem('bubo.current', 'c0');
        }""",
        conversations,
    )
    page.reload()  # one load that reads them: a second navigation would render (and fetch) all again
    wait_ready(page)


def slots(server: Server) -> list[dict[str, Any]]:
    return httpx.get(f"{server.base_url}/slots", timeout=10).json()


def wait_until_idle(server: Server) -> float:
    """Poll /slots (at most 30 s) until no slot is processing; the seconds it took."""
    start = time.monotonic()
    while any(slot["is_processing"] for slot in slots(server)):
        assert time.monotonic() < start + 30, slots(server)
        time.sleep(0.05)
    return time.monotonic() - start


def chat_bodies(page: Page) -> list[dict[str, Any]]:
    """Records the JSON body of each chat request the page sends from now on."""
    bodies: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None,
    )
    return bodies
