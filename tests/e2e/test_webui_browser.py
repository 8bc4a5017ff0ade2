"""The chat page in a real headless Chromium against a real Bubo with the default model: loading,
streaming, stopping, errors, hostile model text, the API key, phone width and router mode.

The page's other features (rendering, attachments, branches, statistics, storage, settings,
accessibility) are in test_webui_features.py; the browser and helpers in _webui.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect
from playwright.sync_api import Error as PlaywrightError

from bubo.config import default_model_path

from .._models import gemma3_path
from ._webui import (  # noqa: F401 - the shared fixtures
    ANSWER_MS,
    TOKEN_COUNT,
    _artifacts,
    _browser,
    _errors,
    _page,
    _profile,
    answered,
    ask,
    chat_bodies,
    open_page,
    set_setting,
    slots,
    store_conversations,
    wait_until_idle,
)
from .conftest import (
    Server,
    bubo_command,
    free_port,
    harness_command,
    hypercorn_command,
    serving,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

KEY = "webui-test-key"
# Records each distinct text of the newest assistant message, as the page shows it while streaming,
# and whether the messages were marked busy meanwhile.
WATCH_STREAM = """() => {
  window.seen = [];
  window.busy = [];
  const messages = document.getElementById('messages');
  new MutationObserver(() => {
    const all = document.querySelectorAll('article.assistant .content');
    const text = all.length ? all[all.length - 1].textContent : '';
    if (text && text !== window.seen[window.seen.length - 1]) window.seen.push(text);
    window.busy.push(messages.getAttribute('aria-busy'));
  }).observe(messages, {childList: true, subtree: true, characterData: true});
}"""


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
    lazy = ("/vendor/highlight/", "/vendor/katex/", "/vendor/pdfjs/")  # loaded when first needed
    assert not [url for url in requested if any(part in url for part in lazy)], requested


def test_an_answer_streams_in_several_updates(page: Page, server: Server, artifacts: Path) -> None:
    """Enter sends; the answer's text grows token by token, the messages are busy meanwhile, one announcement ends it."""
    open_page(page, server)
    set_setting(page, "max_tokens", "60")
    page.evaluate(WATCH_STREAM)
    ask(page, "Write a short Python function that adds two numbers, in a code block.")
    expect(page.locator("article.user .content")).to_have_text(
        "Write a short Python function that adds two numbers, in a code block."
    )
    seen: list[str] = page.evaluate("window.seen")
    final = page.locator("article.assistant .content").text_content() or ""
    assert len(seen) >= 3, seen
    lengths = [len(text) for text in seen]
    assert lengths[0] < lengths[-1], seen
    assert final.strip()
    assert "true" in page.evaluate("window.busy")
    expect(page.locator("#messages")).to_have_attribute("aria-busy", "false")
    expect(page.locator("#announce")).to_have_text("Answer complete.")
    assert page.locator("#messages").get_attribute("aria-live") is None  # not re-read on every frame
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
    """Esc (and the Stop button) abort the request mid-answer: the server's slot goes idle.

    Esc while an input method is composing ends the composition, not the answer.
    """
    open_page(page, server)
    set_setting(page, "max_tokens", "1500")
    page.fill("#draft", "Write a very long story about a lighthouse keeper, with many chapters.")
    page.press("#draft", "Enter")
    expect(page.locator("#stop")).to_be_visible()
    expect(page.locator("article.assistant .content")).not_to_have_text("", timeout=ANSWER_MS)
    page.locator("#draft").dispatch_event("keydown", {"key": "Escape", "isComposing": True, "bubbles": True})
    page.wait_for_timeout(300)
    expect(page.locator("#stop")).to_be_visible()  # still answering
    assert any(slot["is_processing"] for slot in slots(server)), "the answer ended before Stop"
    page.keyboard.press("Escape")
    print(f"slot idle {wait_until_idle(server):.2f} s after Esc")  # noqa: T201 - the measurement
    expect(page.locator("article.assistant .note")).to_have_text("stopped")
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#announce")).to_have_text("Answer stopped.")
    page.screenshot(path=artifacts / "stopped.png")

    page.click("article.assistant .regenerate")  # the same question again, stopped with the button
    expect(page.locator("article.assistant .content")).not_to_have_text("", timeout=ANSWER_MS)
    page.click("#stop")
    print(f"slot idle {wait_until_idle(server):.2f} s after Stop")  # noqa: T201
    expect(page.locator("article.assistant .note")).to_have_text("stopped")
    expect(page.locator("article.assistant .sibling-position")).to_have_text(
        "2/2"
    )  # the first answer is kept


def test_an_answer_stopped_before_its_first_token_is_not_sent_back(page: Page, server: Server) -> None:
    """An empty answer from an early Stop stays on the page, marked stopped, and is left out of the next request."""
    open_page(page, server)
    set_setting(page, "max_tokens", "4")
    held: list[Route] = []  # the first request waits here, so Stop certainly comes before any token
    page.route("**/v1/chat/completions", lambda route: held.append(route))  # noqa: PLW0108 - a builtin is refused
    with answered(page):
        page.fill("#draft", "First question")
        page.press("#draft", "Enter")
        expect(page.locator("#stop")).to_be_visible()
        page.keyboard.press("Escape")
    expect(page.locator("article.assistant .note")).to_have_text("stopped")
    with contextlib.suppress(PlaywrightError):
        held[0].abort()  # the page has already given up on it
    page.unroute("**/v1/chat/completions")
    bodies = chat_bodies(page)
    ask(page, "Second question")
    messages = bodies[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "user"], messages
    assert [m["content"] for m in messages] == ["First question", "Second question"]


def test_a_refused_request_is_shown_as_a_message(page: Page, server: Server, artifacts: Path) -> None:
    """A 400 (max tokens out of range) reads as the server's message naming the field; nothing is lost."""
    open_page(page, server)
    set_setting(page, "max_tokens", "-5")
    ask(page, "Hello")
    error = page.locator("#error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("Error 400 invalid_request (max_tokens)")
    expect(error).to_contain_text("max_tokens must be a positive integer or -1, got -5")
    expect(page.locator("article.user .content")).to_have_text("Hello")  # kept for a retry
    expect(page.locator("article.assistant")).to_have_count(0)
    page.screenshot(path=artifacts / "error-400.png")

    set_setting(page, "max_tokens", "4")
    with answered(page):
        page.click("#send")  # an empty box sends the waiting question again
    expect(error).to_be_hidden()
    expect(page.locator("article.assistant")).to_have_count(1)


def test_model_text_never_becomes_live_html(page: Page, server: Server, artifacts: Path) -> None:
    """Stored answers render as sanitized Markdown: scripts and handlers in model text never run.

    Nor can model text draw form controls or a fake user bubble, borrow the page's classes, or stand in
    for one of the page's elements (an id of its own: DOM clobbering); its links open a new tab.
    """
    open_page(page, server)
    hostile = (
        "**bold** <img src=x onerror=\"window.pwned='img'\"> <script>window.pwned='script'</script>"
        "<a href=\"javascript:window.pwned='link'\">link</a>\n\n```js\nalert(1)\n```\n\n"
        '<textarea id="draft"></textarea>\n\n'
        '<form action="/x"><input name="q" value="fake"><button>Send</button></form>'
        "<dialog open>a dialog</dialog>"
        '<article class="message user" data-index="0" style="color:red"><div class="role">You</div>fake</article>'
        '<p class="message user" data-x="1" id="messages" name="composer">spoofed user bubble</p>\n\n'
        "[out](https://example.invalid/page) [script](javascript:window.pwned='md')"
    )
    messages = [{"role": "user", "content": "<b>not bold</b>"}, {"role": "assistant", "content": hostile}]
    store_conversations(page, [messages])
    content = page.locator("article.assistant .content")
    expect(content.locator("strong")).to_have_text("bold")
    expect(content.locator("pre code")).to_have_text("alert(1)")
    content.locator(".code-block .copy").click()
    expect(content.locator(".code-block .copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "alert(1)"
    for tag in ("script", "[onerror]", "a[href^='javascript']", "form", "input", "button:not(.copy)", "textarea",
                "dialog", "article", "[style]", "[id]", "[name]", "[data-index]", "[data-x]"):  # fmt: skip
        assert content.locator(tag).count() == 0, tag
    classes = content.evaluate("c => [...c.querySelectorAll('[class]')].map(n => n.className)")
    own = {"code-block", "code-head", "lang", "copy", "hljs"}  # the page's own, and highlight.js's tokens
    assert all(
        c in own or re.fullmatch(r"(hljs-[\w-]+|[a-z]+_)( (hljs-[\w-]+|[a-z]+_))*", c) for c in classes
    ), classes
    expect(content).to_contain_text('<img src=x onerror="window.pwned=')  # raw HTML reads as text
    expect(content).to_contain_text("spoofed user bubble")
    assert page.locator("article.user").count() == 1
    out = content.locator("a[href='https://example.invalid/page']")
    expect(out).to_have_attribute("target", "_blank")
    expect(out).to_have_attribute("rel", "noopener noreferrer")
    content.locator("a", has_text="script").click()
    assert page.evaluate("window.pwned") is None
    expect(page.locator("article.user .content")).to_have_text("<b>not bold</b>")  # the user's text is text
    page.screenshot(path=artifacts / "hostile-text.png")

    assert page.evaluate("document.querySelectorAll('#draft').length") == 1  # the page's own alone
    set_setting(page, "max_tokens", "4")
    ask(page, "Hi")
    expect(page.locator("article.user .content").last).to_have_text("Hi")
    expect(page.locator("article.assistant")).to_have_count(2)
    assert page.evaluate("document.images.length") == 0


def test_reasoning_and_tool_calls_are_shown(page: Page, server: Server, artifacts: Path) -> None:
    """Reasoning folds into a block of its own; each tool call shows its name and arguments, as text."""
    open_page(page, server)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"<Paris>"}'},
    }
    answer = {
        "role": "assistant",
        "content": "",
        "reasoning": "The user wants the weather.",
        "tool_calls": [call],
    }
    store_conversations(page, [[{"role": "user", "content": "Weather in Paris?"}, answer]])
    article = page.locator("article.assistant")
    reasoning = article.locator("details.reasoning")
    expect(reasoning.locator("summary")).to_have_text("Reasoning")
    expect(reasoning.locator(".text")).to_be_hidden()  # folded once the answer is complete
    reasoning.locator("summary").click()
    expect(reasoning.locator(".text")).to_have_text("The user wants the weather.")
    expect(article.locator("details.tool-calls summary")).to_have_text("Tool calls (1)")
    expect(article.locator("details.tool-calls pre")).to_have_text('get_weather({"city":"<Paris>"})')
    page.screenshot(path=artifacts / "reasoning-tool-calls.png")


def test_phone_width(browser: Browser, server: Server, artifacts: Path) -> None:
    """At 390 px the conversation list is a drawer: out of the tab order while folded, its toggle saying so.

    On a touch screen the page never focuses the message box by itself (that would pop up the keyboard).
    """
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        open_page(page, server)
        toggle = page.locator("#toggle-sidebar")
        expect(page.locator("#draft")).to_be_in_viewport()
        expect(page.locator("#send")).to_be_in_viewport()
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        expect(toggle).to_have_attribute("aria-expanded", "false")
        assert page.locator("#sidebar").evaluate("s => s.inert")
        assert page.evaluate("document.activeElement === document.body")  # no focus grab
        page.screenshot(path=artifacts / "phone.png")
        toggle.click()
        expect(page.locator("#sidebar")).to_have_css("transform", "none")  # slid in completely
        expect(page.locator("#new-chat")).to_be_in_viewport()
        expect(toggle).to_have_attribute("aria-expanded", "true")
        assert not page.locator("#sidebar").evaluate("s => s.inert")
        page.screenshot(path=artifacts / "phone-conversations.png")
        page.mouse.click(370, 400)  # beside the list: it folds away again
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        toggle.click()
        expect(page.locator("#sidebar")).to_have_css("transform", "none")
        page.keyboard.press("Escape")
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        expect(toggle).to_have_attribute("aria-expanded", "false")
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
    """The page asks for the key in a modal dialog that keeps the focus, refuses a wrong key, keeps the right one per tab."""
    page.goto(keyed_server.base_url + "/")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#key-input")).to_be_focused()
    assert page.evaluate("document.querySelector('#key-dialog').matches(':modal')")
    for _ in range(4):  # Tab goes round the dialog's own controls
        page.keyboard.press("Tab")
        assert page.evaluate("document.querySelector('#key-dialog').contains(document.activeElement)")
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.querySelector('#key-dialog').contains(document.activeElement)")
    page.screenshot(path=artifacts / "api-key.png")
    page.fill("#key-input", "wrong")
    page.press("#key-input", "Enter")
    expect(page.locator("#key-error")).to_have_text("The server refused this key.")
    expect(dialog).to_be_visible()
    page.fill("#key-input", KEY)
    page.press("#key-input", "Enter")
    expect(dialog).to_be_hidden()
    expect(page.locator("#model")).to_contain_text("tokens context", timeout=30_000)
    assert page.evaluate("sessionStorage.getItem('bubo.apiKey')") == KEY
    assert page.evaluate("localStorage.getItem('bubo.apiKey')") is None
    set_setting(page, "max_tokens", "4")
    ask(page, "Hi")
    page.reload()  # the same tab keeps the key
    expect(page.locator("#model")).to_contain_text("tokens context", timeout=30_000)
    expect(dialog).to_be_hidden()


@pytest.fixture(name="busy_server", scope="module")
def _busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """The harness (harness_server.py) with one slot and no queue; its memory reading comes from a file."""
    control = tmp_path_factory.mktemp("webui-control")
    log = tmp_path_factory.mktemp("webui-harness") / "harness.log"
    env = {
        "BUBO_PARALLEL": "1",
        "BUBO_MAX_QUEUE": "0",
        "BUBO_MEMORY_LOW_WATER_MIB": "16",
        "BUBO_DEVICE_RECOVERY": "on",
    }
    with serving(log, env=env, command=harness_command(control)) as server:
        yield server, control


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
    set_setting(page, "max_tokens", "4")
    with answered(page):
        page.click("#send")  # memory is back: the same question goes through
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


@pytest.fixture(name="router", scope="module")
def _router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A router over two models (SmolLM2, Gemma 3 270M) that loads models only when asked (--no-models-autoload)."""
    tmp = tmp_path_factory.mktemp("router")
    (tmp / "models").mkdir()
    (tmp / "models" / "smollm2.gguf").symlink_to(default_model_path())
    (tmp / "models" / "gemma3.gguf").symlink_to(gemma3_path())
    port = free_port()
    command = [bubo_command(), "serve", "--models-dir", str(tmp / "models"), "--port", str(port)]
    server = start_server([*command, "--no-models-autoload", "-np", "1"], port, tmp / "router.log")
    yield server
    assert stop_server(server) == 0


def model_status(server: Server) -> dict[str, str]:
    return {
        m["id"]: m["status"]["value"]
        for m in httpx.get(server.base_url + "/models", timeout=10).json()["data"]
    }


def test_a_router_s_model_that_is_not_loaded_is_named_and_left_unloaded(page: Page, router: Server) -> None:
    """The page asks the context size without loading the model, and learns it once the model is loaded.

    Each chat request carries the conversation's id, for a load balancer's affinity (docs/deploy.md).
    """
    props: list[str] = []
    chats: list[dict[str, str]] = []
    page.on("request", lambda r: props.append(r.url) if "/props" in r.url else None)
    page.on("request", lambda r: chats.append(r.headers) if r.url.endswith("/v1/chat/completions") else None)
    page.goto(router.base_url + "/")
    expect(page.locator("#model")).to_have_text("gemma3")  # the first model; no context size yet, no retrying
    expect(page.locator("#model-status")).to_have_text("unloaded")
    assert props == [f"{router.base_url}/props", f"{router.base_url}/props?model=gemma3&autoload=false"]
    assert model_status(router) == {"gemma3": "unloaded", "smollm2": "unloaded"}

    httpx.post(router.base_url + "/models/load", json={"model": "smollm2"}, timeout=10).raise_for_status()
    page.select_option("#model-picker", "smollm2")
    expect(page.locator("#model-status")).to_have_text("loaded", timeout=120_000)  # the page polls /models
    expect(page.locator("#model")).to_have_text("smollm2 · 2048 tokens context")
    set_setting(page, "max_tokens", "4")
    ask(page, "Hi")
    conversation = page.evaluate("localStorage.getItem('bubo.current')")
    assert [headers.get("x-conversation-id") for headers in chats] == [conversation]


def test_the_router_s_picker_loads_and_unloads_a_model(page: Page, router: Server, artifacts: Path) -> None:
    """The picker lists the models directory with each status; Load starts a second model, which then answers.

    The conversation remembers its model across a reload; Unload stops the model's child.
    """
    page.goto(router.base_url + "/")
    picker = page.locator("#model-picker")
    expect(picker.locator("option")).to_have_count(2)
    page.select_option("#model-picker", "gemma3")
    expect(page.locator("#model-status")).to_have_text("unloaded")
    page.click("#model-load")
    expect(page.locator("#model-status")).to_have_text("loaded", timeout=120_000)
    expect(page.locator("#model")).to_contain_text("gemma3 · ")
    expect(picker.locator("option[value='gemma3']")).to_have_text("gemma3 (loaded)")
    page.screenshot(path=artifacts / "router-picker.png")
    set_setting(page, "max_tokens", "4")
    bodies: list[dict] = []
    page.on(
        "request",
        lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None,
    )
    ask(page, "Hello")
    assert bodies[0]["model"] == "gemma3"
    expect(page.locator("article.assistant")).to_have_count(1)
    page.select_option("#model-picker", "smollm2")  # elsewhere, then back: the conversation's model returns
    page.select_option("#model-picker", "gemma3")
    page.reload()
    expect(picker).to_have_value("gemma3")
    page.click("#model-unload")
    expect(page.locator("#model-status")).to_have_text("unloaded", timeout=60_000)
    assert model_status(router)["gemma3"] == "unloaded"
