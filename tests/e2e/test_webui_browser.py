"""The chat page in a real headless Chromium against a real Bubo with the default model.

The browser is Debian's ``chromium`` (``apt-get install chromium``; ``nox -s tests`` installs it), found on
PATH or at ``$BUBO_CHROMIUM``, driven through Playwright's Python API with ``executable_path``: no
browser download.  A missing browser fails the run.  Screenshots land in ``test-artifacts/webui/`` (or
``$BUBO_TEST_ARTIFACTS/webui/``); the run prints where.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from bubo.config import default_model_path

from .conftest import Server, bubo_command, free_port, hypercorn_command, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("harness_server.py")
KEY = "webui-test-key"
# How long the page may take for what the model does (a whole answer on two busy cores), not a latency claim.
ANSWER_MS = 120_000
# Playwright's 5 s default for each expectation is short for a server and a browser sharing two busy cores.
expect.set_options(timeout=30_000)
TOKEN_COUNT = re.compile(r"[1-9]\d* / 2048 tokens")  # the draft counted against the context
# Records each distinct text of the newest assistant message, as the page shows it while streaming.
WATCH_STREAM = """() => {
  window.seen = [];
  new MutationObserver(() => {
    const all = document.querySelectorAll('article.assistant .content');
    const text = all.length ? all[all.length - 1].textContent : '';
    if (text && text !== window.seen[window.seen.length - 1]) window.seen.push(text);
  }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
}"""


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


@pytest.fixture(name="browser", scope="module")
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


@pytest.fixture(name="page")
def _page(browser: Browser, errors: list[str]) -> Iterator[Page]:
    """A fresh browser profile (empty localStorage) with a desktop-sized window; page errors fail the test."""
    context = browser.new_context(viewport={"width": 1100, "height": 720})
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield page
    context.close()
    refused = ("status of 400", "status of 401", "status of 503")  # requests the tests make fail on purpose
    assert not [e for e in errors if not any(r in e for r in refused)], "\n".join(errors)


def open_page(page: Page, server: Server) -> None:
    page.goto(server.base_url + "/")
    expect(page.locator("#model")).to_contain_text("tokens context", timeout=30_000)


def set_setting(page: Page, selector: str, value: str) -> None:
    if not page.locator("#settings").evaluate("d => d.open"):
        page.click("#settings summary")
    page.fill(selector, value)


def answer_done(page: Page) -> None:
    """Wait until the newest answer is complete (its Regenerate button appears once the request ended)."""
    expect(page.locator("article.assistant .regenerate")).to_be_visible(timeout=ANSWER_MS)


def store_conversation(page: Page, server: Server, messages: list[dict]) -> None:
    """Put one conversation in the page's localStorage, as an earlier visit would have, and reload."""
    conversation = {"id": "stored", "title": "", "messages": messages}
    page.evaluate(
        "c => { localStorage.setItem('bubo.conversations', JSON.stringify([c]));"
        " localStorage.setItem('bubo.current', c.id); }",
        conversation,
    )
    page.reload()
    open_page(page, server)


def slots(server: Server) -> list[dict]:
    return httpx.get(f"{server.base_url}/slots", timeout=10).json()


def wait_until_idle(server: Server) -> float:
    """Poll /slots (at most 30 s) until no slot is processing; the seconds it took."""
    start = time.monotonic()
    while any(slot["is_processing"] for slot in slots(server)):
        assert time.monotonic() < start + 30, slots(server)
        time.sleep(0.05)
    return time.monotonic() - start


def test_the_page_comes_from_this_server_alone(page: Page, server: Server, artifacts: Path) -> None:
    """The page, its token count and the model's context size appear; nothing comes from elsewhere."""
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    open_page(page, server)
    expect(page.locator("#model")).to_contain_text("smollm2-135m-instruct-q4-1 · 2048 tokens context")
    page.fill("#draft", "How many tokens is this?")
    expect(page.locator("#token-count")).to_have_text(TOKEN_COUNT)
    page.screenshot(path=artifacts / "empty.png")
    assert requested
    assert all(url.startswith(server.base_url + "/") for url in requested), requested


def test_an_answer_streams_in_several_updates(page: Page, server: Server, artifacts: Path) -> None:
    """Enter sends; the answer's text grows token by token on the page, then shows as Markdown."""
    open_page(page, server)
    set_setting(page, "#max-tokens", "60")
    page.evaluate(WATCH_STREAM)
    page.fill("#draft", "Write a short Python function that adds two numbers, in a code block.")
    page.press("#draft", "Enter")
    expect(page.locator("article.user .content")).to_have_text(
        "Write a short Python function that adds two numbers, in a code block."
    )
    answer_done(page)
    seen: list[str] = page.evaluate("window.seen")
    final = page.locator("article.assistant .content").text_content() or ""
    assert len(seen) >= 3, seen
    lengths = [len(text) for text in seen]
    assert lengths[0] < lengths[-1], seen
    assert final.strip()
    assert page.locator("#draft").input_value() == ""
    assert page.locator("#stop").is_hidden()
    page.screenshot(path=artifacts / "answer.png")


def test_shift_enter_is_a_new_line(page: Page, server: Server) -> None:
    open_page(page, server)
    page.click("#draft")
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    assert page.locator("#draft").input_value() == "first line\nsecond line"
    assert page.locator("article.user").count() == 0


def test_stop_ends_the_generation_on_the_server(page: Page, server: Server, artifacts: Path) -> None:
    """Esc (and the Stop button) abort the request mid-answer: the server's slot goes idle."""
    open_page(page, server)
    set_setting(page, "#max-tokens", "1500")
    page.fill("#draft", "Write a very long story about a lighthouse keeper, with many chapters.")
    page.press("#draft", "Enter")
    expect(page.locator("#stop")).to_be_visible()
    expect(page.locator("article.assistant .content")).not_to_have_text("", timeout=ANSWER_MS)
    assert any(slot["is_processing"] for slot in slots(server)), "the answer ended before Stop"
    page.keyboard.press("Escape")
    print(f"slot idle {wait_until_idle(server):.2f} s after Esc")  # noqa: T201 - the measurement
    expect(page.locator("article.assistant .note")).to_have_text("stopped")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_hidden()
    page.screenshot(path=artifacts / "stopped.png")

    page.click("article.assistant .regenerate")  # the same question again, stopped with the button
    expect(page.locator("article.assistant .content")).not_to_have_text("", timeout=ANSWER_MS)
    page.click("#stop")
    print(f"slot idle {wait_until_idle(server):.2f} s after Stop")  # noqa: T201
    expect(page.locator("article.assistant .note")).to_have_text("stopped")


def test_conversations_are_kept_across_reloads(page: Page, server: Server) -> None:
    """A conversation survives a reload; it can be renamed, a new one started, and one deleted."""
    open_page(page, server)
    set_setting(page, "#max-tokens", "12")
    page.fill("#draft", "Name a colour.")
    page.press("#draft", "Enter")
    answer_done(page)
    answer = page.locator("article.assistant .content").text_content()
    page.reload()
    open_page(page, server)
    expect(page.locator("article.user .content")).to_have_text("Name a colour.")
    expect(page.locator("article.assistant .content")).to_have_text(answer or "")
    expect(page.locator("#max-tokens")).to_have_value("12")

    page.once("dialog", lambda dialog: dialog.accept("Colours"))
    page.click("#conversations li.current .rename")
    expect(page.locator("#conversations li.current .open")).to_have_text("Colours")
    page.click("#new-chat")
    expect(page.locator("#conversations li")).to_have_count(2)
    expect(page.locator("article")).to_have_count(0)
    page.reload()
    open_page(page, server)
    expect(page.locator("#conversations li")).to_have_count(2)
    page.click("#conversations li:has-text('Colours') .open")
    expect(page.locator("article.user .content")).to_have_text("Name a colour.")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#conversations li.current .delete")
    expect(page.locator("#conversations li")).to_have_count(1)
    expect(page.locator("#conversations li")).not_to_contain_text("Colours")


def test_edit_and_resend_the_last_message(page: Page, server: Server) -> None:
    """Edit puts the last question back in the box without its answer; sending it asks again."""
    open_page(page, server)
    set_setting(page, "#max-tokens", "8")
    page.fill("#draft", "Say one word.")
    page.press("#draft", "Enter")
    answer_done(page)
    page.click("article.assistant .edit")
    expect(page.locator("#draft")).to_have_value("Say one word.")
    expect(page.locator("article")).to_have_count(0)
    page.fill("#draft", "Say two words.")
    page.press("#draft", "Enter")
    answer_done(page)
    expect(page.locator("article.user .content")).to_have_text("Say two words.")
    expect(page.locator("article")).to_have_count(2)


def test_a_refused_request_is_shown_as_a_message(page: Page, server: Server, artifacts: Path) -> None:
    """A 400 (max tokens out of range) reads as the server's message naming the field; nothing is lost."""
    open_page(page, server)
    set_setting(page, "#max-tokens", "-5")
    page.fill("#draft", "Hello")
    page.press("#draft", "Enter")
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Error 400 invalid_request (max_tokens)")
    expect(error).to_contain_text("max_tokens must be a positive integer or -1, got -5")
    expect(page.locator("article.user .content")).to_have_text("Hello")  # kept for a retry
    expect(page.locator("article.assistant")).to_have_count(0)
    page.screenshot(path=artifacts / "error-400.png")

    set_setting(page, "#max-tokens", "4")
    page.click("#send")  # an empty box sends the waiting question again
    answer_done(page)
    expect(error).to_be_hidden()


def test_model_text_never_becomes_live_html(page: Page, server: Server, errors: list[str]) -> None:
    """Stored answers render as sanitized Markdown: scripts and handlers in model text never run.

    Nor can an element of model text stand in for one of the page's (an id of its own: DOM clobbering).
    """
    open_page(page, server)
    hostile = (
        "**bold** <img src=x onerror=\"window.pwned='img'\"> <script>window.pwned='script'</script>"
        "<a href=\"javascript:window.pwned='link'\">link</a>\n\n```js\nalert(1)\n```\n\n"
        '<textarea id="draft"></textarea>\n\n'
        '<form action="/x"><input name="q" value="fake"><button>Send</button></form>'
        '<dialog open>a dialog</dialog>'
        '<article class="message user" data-index="0" style="color:red"><div class="role">You</div>fake</article>'
        '<p class="message user" data-x="1" id="messages" name="composer">spoofed user bubble</p>\n\n'
        "[out](https://example.invalid/page)"
    )
    messages = [{"role": "user", "content": "<b>not bold</b>"}, {"role": "assistant", "content": hostile}]
    store_conversation(page, server, messages)
    content = page.locator("article.assistant .content")
    expect(content.locator("strong")).to_have_text("bold")
    expect(content.locator("pre code")).to_have_text("alert(1)\n")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    content.locator("pre .copy").click()
    expect(content.locator("pre .copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "alert(1)\n"
    assert content.locator("script").count() == 0
    assert content.locator("[onerror]").count() == 0
    assert content.locator("a[href^='javascript']").count() == 0
    for tag in ("form", "input", "button:not(.copy)", "textarea", "dialog", "article", "[class]:not(.copy)",
                "[style]", "[id]", "[name]", "[data-index]", "[data-x]"):  # fmt: skip
        assert content.locator(tag).count() == 0, tag
    expect(content).to_contain_text("spoofed user bubble")  # the words stay, as plain text
    assert page.locator("article.user").count() == 1
    out = content.locator("a[href='https://example.invalid/page']")
    expect(out).to_have_attribute("target", "_blank")
    expect(out).to_have_attribute("rel", "noopener noreferrer")
    expect(content).to_contain_text('<img src=x onerror="window.pwned=')  # raw HTML reads as text
    content.locator("a[href='https://example.invalid/page']").evaluate("a => a.removeAttribute('href')")
    content.locator("a").click()  # (with the address removed: the test opens no page elsewhere)
    assert page.evaluate("window.pwned") is None
    expect(page.locator("article.user .content")).to_have_text("<b>not bold</b>")  # the user's text is text

    assert page.evaluate("document.querySelectorAll('#draft').length") == 1  # the page's own alone
    set_setting(page, "#max-tokens", "4")
    page.locator("#composer #draft").fill("Hi")
    page.locator("#composer #draft").press("Enter")
    expect(page.locator("article.user .content").last).to_have_text("Hi")
    expect(page.locator("article.assistant")).to_have_count(2)
    answer_done(page)
    assert page.evaluate("document.images.length") == 0


def test_reasoning_and_tool_calls_are_shown(page: Page, server: Server, artifacts: Path) -> None:
    """Reasoning folds into a block of its own; each tool call shows its name and arguments, as text."""
    open_page(page, server)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"<Paris>"}'},
    }
    store_conversation(
        page,
        server,
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning": "The user wants the weather.",
                "tool_calls": [call],
            },
        ],
    )
    answer = page.locator("article.assistant")
    reasoning = answer.locator("details.reasoning")
    expect(reasoning.locator("summary")).to_have_text("Reasoning")
    expect(reasoning.locator(".text")).to_be_hidden()  # folded once the answer is complete
    reasoning.locator("summary").click()
    expect(reasoning.locator(".text")).to_have_text("The user wants the weather.")
    expect(answer.locator("details.tool-calls summary")).to_have_text("Tool calls (1)")
    expect(answer.locator("details.tool-calls pre")).to_have_text('get_weather({"city":"<Paris>"})')
    page.screenshot(path=artifacts / "reasoning-tool-calls.png")


def test_phone_width(browser: Browser, server: Server, artifacts: Path) -> None:
    """At 390 px the conversation list folds away behind a button; the composer stays usable."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        open_page(page, server)
        expect(page.locator("#draft")).to_be_in_viewport()
        expect(page.locator("#send")).to_be_in_viewport()
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        page.screenshot(path=artifacts / "phone.png")
        page.click("#toggle-sidebar")
        expect(page.locator("#sidebar")).to_have_css("transform", "none")  # slid in completely
        expect(page.locator("#new-chat")).to_be_in_viewport()
        page.screenshot(path=artifacts / "phone-conversations.png")
        page.mouse.click(370, 400)  # beside the list: it folds away again
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        page.click("#toggle-sidebar")
        expect(page.locator("#sidebar")).to_have_css("transform", "none")
        page.keyboard.press("Escape")
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
    finally:
        context.close()


@pytest.fixture(name="keyed_server", scope="module")
def _keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("keyed") / "hypercorn.log"
    server = start_server(hypercorn_command(port), port, log, env={"BUBO_API_KEY": KEY}, api_key=KEY)
    yield server
    stop_server(server)


def test_a_server_with_a_key_asks_for_it(page: Page, keyed_server: Server, artifacts: Path) -> None:
    """The page loads without the key, asks for it, refuses a wrong one, and keeps the right one per tab."""
    page.goto(keyed_server.base_url + "/")
    overlay = page.locator("#key-overlay")
    expect(overlay).to_be_visible()
    expect(page.locator("#key-input")).to_be_focused()
    page.screenshot(path=artifacts / "api-key.png")
    page.fill("#key-input", "wrong")
    page.press("#key-input", "Enter")
    expect(page.locator("#key-error")).to_have_text("The server refused this key.")
    expect(overlay).to_be_visible()
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    expect(overlay).to_be_hidden()
    expect(page.locator("#model")).to_contain_text("tokens context", timeout=30_000)
    assert page.evaluate("sessionStorage.getItem('bubo.apiKey')") == KEY
    assert page.evaluate("localStorage.getItem('bubo.apiKey')") is None
    set_setting(page, "#max-tokens", "4")
    page.fill("#draft", "Hi")
    page.press("#draft", "Enter")
    answer_done(page)
    page.reload()  # the same tab keeps the key
    expect(page.locator("#model")).to_contain_text("tokens context", timeout=30_000)
    expect(overlay).to_be_hidden()


@pytest.fixture(name="busy_server", scope="module")
def _busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """The harness (harness_server.py) with one slot and no queue; its memory reading comes from a file."""
    control = tmp_path_factory.mktemp("webui-control")
    port = free_port()
    server = start_server(
        [sys.executable, str(HARNESS), "--port", str(port), "--control", str(control)],
        port,
        tmp_path_factory.mktemp("webui-harness") / "harness.log",
        env={
            "BUBO_PARALLEL": "1",
            "BUBO_MAX_QUEUE": "0",
            "BUBO_MEMORY_LOW_WATER_MIB": "16",
            "BUBO_DEVICE_RECOVERY": "on",
        },
    )
    yield server, control
    stop_server(server)


def test_a_full_queue_is_shown_as_a_message(
    page: Page, busy_server: tuple[Server, Path], artifacts: Path
) -> None:
    """While another client holds the only slot and nothing may wait, sending reads as 503 queue_full."""
    server, _control = busy_server
    open_page(page, server)
    hold = {"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completion", json=hold, timeout=120) as held:
        assert held.status_code == 200
        # Keep the line iterator referenced: a dropped one is closed, and closing it hangs up on the
        # server, which then frees the slot (a race the page's request used to win now and then).
        lines = held.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # the slot is generating
        page.fill("#draft", "Hello")
        page.press("#draft", "Enter")
        error = page.locator("#error")
        expect(error).to_contain_text("The server is busy: its queue is full (503 queue_full). Try again in")
        page.screenshot(path=artifacts / "error-queue-full.png")
    print(f"slot idle {wait_until_idle(server):.2f} s after the holding client left")  # noqa: T201
    expect(page.locator("article.user .content")).to_have_text("Hello")


def test_memory_pressure_is_shown_as_a_message(page: Page, busy_server: tuple[Server, Path]) -> None:
    """Below the server's low-water mark a generation is refused; the page says why and when to retry."""
    server, control = busy_server
    open_page(page, server)
    reading = control / "memory.json"
    reading.write_text(json.dumps({"available_bytes": 10 * 1024 * 1024, "limit_bytes": 16_000 * 1024 * 1024}))
    try:
        page.fill("#draft", "Hello")
        page.press("#draft", "Enter")
        expect(page.locator("#error")).to_contain_text(
            "The server is low on memory (503 memory_pressure). Try again in 5 s."
        )
    finally:
        reading.unlink()
    set_setting(page, "#max-tokens", "4")
    page.click("#send")  # memory is back: the same question goes through
    answer_done(page)
    expect(page.locator("#error")).to_be_hidden()


def test_an_error_inside_the_stream_is_shown(page: Page, busy_server: tuple[Server, Path]) -> None:
    """A failure after the answer began (the engine lost mid-decode) ends the answer with the server's error."""
    server, control = busy_server
    open_page(page, server)
    switch = control / "decode-fails"
    switch.touch()
    try:
        page.fill("#draft", "Hello")
        page.press("#draft", "Enter")
        expect(page.locator("#error")).to_contain_text("Error device_lost:")
    finally:
        switch.unlink()
    deadline = time.monotonic() + 60  # the server reloads the model (--device-recovery) for later tests
    while httpx.get(f"{server.base_url}/ready", timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.fixture(name="router_without_autoload", scope="module")
def _router_without_autoload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A router over one model (SmolLM2) that loads models only when asked (--no-models-autoload)."""
    tmp = tmp_path_factory.mktemp("router")
    (tmp / "models").mkdir()
    (tmp / "models" / "smollm2.gguf").symlink_to(default_model_path())
    port = free_port()
    command = [bubo_command(), "serve", "--models-dir", str(tmp / "models"), "--port", str(port)]
    server = start_server([*command, "--no-models-autoload", "-np", "1"], port, tmp / "router.log")
    yield server
    assert stop_server(server) == 0


def test_a_router_s_model_that_is_not_loaded_is_named_and_left_unloaded(
    page: Page, router_without_autoload: Server
) -> None:
    """The page asks the context size without loading the model, and learns it after the first answer.

    Each chat request carries the conversation's id, for a load balancer's affinity (docs/deploy.md).
    """
    server = router_without_autoload
    props: list[str] = []
    chats: list[dict[str, str]] = []
    page.on("request", lambda r: props.append(r.url) if "/props" in r.url else None)
    page.on("request", lambda r: chats.append(r.headers) if r.url.endswith("/v1/chat/completions") else None)
    page.goto(server.base_url + "/")
    expect(page.locator("#model")).to_have_text("smollm2")  # no context size yet, and no retrying
    assert props == [f"{server.base_url}/props?model=smollm2&autoload=false"]
    models = httpx.get(server.base_url + "/models", timeout=10).json()["data"]
    assert [m["status"]["value"] for m in models] == ["unloaded"]

    httpx.post(server.base_url + "/models/load", json={"model": "smollm2"}, timeout=10).raise_for_status()
    deadline = time.monotonic() + 120  # the child loads its model (bounded generously)
    while httpx.get(server.base_url + "/models", timeout=10).json()["data"][0]["status"]["value"] != "loaded":
        assert time.monotonic() < deadline, "the model never loaded"
        time.sleep(0.2)
    set_setting(page, "#max-tokens", "4")
    page.fill("#draft", "Hi")
    page.press("#draft", "Enter")
    answer_done(page)
    expect(page.locator("#model")).to_have_text("smollm2 · 2048 tokens context")
    conversation = page.evaluate("localStorage.getItem('bubo.current')")
    assert [headers.get("x-conversation-id") for headers in chats] == [conversation]
