"""Open WebUI in Chromium against Bubo, once through Bubo's Ollama API and once through its OpenAI API.

Each test is what a user does in the page; each checks what the page shows and what Open
WebUI sent Bubo for it (through the logging proxy), and that every answer was a 200.  The tests
of one connection type share one Open WebUI and one chat, in order: the first chat, its
regenerated answer, then a new chat with a system prompt and one with an uploaded file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents.proxy import Exchange
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from tests.e2e._webui import chromium_path

from .conftest import OpenWebUI, json_body

pytestmark = [pytest.mark.openwebui]

ANSWER_MS = 180_000  # a whole answer, or a title, on two cores busy with other work
expect.set_options(timeout=60_000)
BUILTIN_TOOLS_MS = 600_000  # a 7,000-token prefill, minutes when the two cores are busy with other work
CHAT_PATHS = ("/api/chat", "/v1/chat/completions")
SYSTEM_PROMPT = "You are a ship's parrot. Answer in one short sentence."
CODE_WORD = "tawny-frogmouth-417"
# Each answer's length (the model's Max Tokens): the tests read how an answer arrives, not what it says.
MAX_TOKENS = 48
# Records each distinct text of the newest answer as the page shows it while it streams.
WATCH_STREAM = """() => {
  window.seen = [];
  new MutationObserver(() => {
    const all = document.querySelectorAll('#response-content-container');
    const text = all.length ? all[all.length - 1].textContent.trim() : '';
    if (text && text !== window.seen[window.seen.length - 1]) window.seen.push(text);
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture(name="browser", scope="module")
def _browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(name="page", scope="module")
def _page(browser: Browser, webui: OpenWebUI) -> Iterator[Page]:
    """One tab for the module's tests; nothing it loads may come from beyond Open WebUI."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    elsewhere: list[str] = []
    page.on(
        "request",
        lambda r: None if r.url.startswith((webui.base_url, "data:", "blob:")) else elsewhere.append(r.url),
    )
    page.goto(webui.base_url + "/")
    expect(page.locator("#chat-input")).to_be_visible()
    configure_for_a_cpu(page, served_name(webui, "bubo"))
    page.reload()
    expect(page.locator("#chat-input")).to_be_visible()
    dismiss_release_notes(page)
    yield page
    context.close()
    assert not elsewhere, elsewhere


@pytest.fixture(name="artifacts", scope="module")
def _artifacts(webui: OpenWebUI) -> Path:
    folder = Path("test-artifacts") / "openwebui" / webui.connection
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def served_name(webui: OpenWebUI, name: str) -> str:
    """A model's name as the connection lists it: Ollama's have a tag."""
    return f"{name}:latest" if webui.connection == "ollama" else name


def configure_for_a_cpu(page: Page, model: str) -> None:
    """Turn off *model*'s "Builtin Tools" capability and set its Max Tokens, as Admin Settings → Models does.

    Open WebUI 0.12 otherwise offers its 36 built-in tools (memory, notes, knowledge, calendar,
    automations) with every chat: about 7,000 tokens of prompt, minutes of prefill on a busy CPU.
    Max Tokens applies to every request for the model but the title's (which asks for 1,000).
    """
    status = page.evaluate(
        """async ({model, maxTokens}) => {
          const response = await fetch('/api/v1/models/create', {method: 'POST',
            headers: {'Content-Type': 'application/json', Authorization: `Bearer ${localStorage.token}`},
            body: JSON.stringify({id: model, base_model_id: null, name: model,
              meta: {capabilities: {builtin_tools: false}}, params: {max_tokens: maxTokens}})});
          return response.status;
        }""",
        {"model": model, "maxTokens": MAX_TOKENS},
    )
    assert status == 200


def dismiss_release_notes(page: Page) -> None:
    """The "What's New" dialog a new user sees once."""
    button = page.get_by_text("Okay, Let's Go!")
    try:
        button.wait_for(timeout=5_000)
    except PlaywrightTimeoutError:  # no dialog this time
        return
    button.click()


def chats(webui: OpenWebUI, since: int = 0) -> list[Exchange]:
    return [e for e in webui.exchanges()[since:] if e.method == "POST" and e.endpoint in CHAT_PATHS]


def wait_for_chats(
    webui: OpenWebUI, since: int, *, streamed: int, within_ms: int = ANSWER_MS
) -> list[Exchange]:
    """Until *streamed* streamed chat requests after exchange *since* have ended; all chat requests since."""
    deadline = time.monotonic() + within_ms / 1000
    while time.monotonic() < deadline:
        found = chats(webui, since)
        done = [e for e in found if json_body(e).get("stream") and e.ended_s is not None]
        if len(done) >= streamed:
            return found
        time.sleep(0.2)
    pytest.fail(
        f"{streamed} streamed chat requests did not end: {[(e.path, e.status) for e in chats(webui, since)]}"
    )


def open_model_menu(page: Page) -> Locator:
    page.click("#model-selector-model-button")
    menu = page.get_by_role("listbox", name="Available models")
    expect(menu).to_be_visible()
    return menu


def new_chat(page: Page, webui: OpenWebUI) -> None:
    """What the sidebar's New Chat link does (it is inert while the sidebar is folded)."""
    page.goto(webui.base_url + "/")
    expect(page.locator("#chat-input")).to_be_visible()
    expect(page.locator("#model-selector-model-button")).to_contain_text(served_name(webui, "bubo"))


def wait_until_read(page: Page, name: str, text: str) -> None:
    """Until Open WebUI has stored the uploaded file *name* with its text (its /api/v1/files/ says so)."""
    deadline = time.monotonic() + 60
    while not page.evaluate(
        """async ([name, text]) => {
          const response = await fetch('/api/v1/files/', {headers: {Authorization: `Bearer ${localStorage.token}`}});
          const {items} = await response.json();
          return items.some(f => f.filename === name && (f.data?.content || '').includes(text));
        }""",
        [name, text],
    ):
        assert time.monotonic() < deadline, f"{name} not read"
        time.sleep(0.2)


def send(page: Page, text: str) -> None:
    page.locator("#chat-input").click()
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def last_answer(page: Page) -> str:
    return page.locator("#response-content-container").last.inner_text().strip()


def assert_all_ok(exchanges: list[Exchange]) -> None:
    """Once each has ended (they may still stream): every one a 200 with no error in its stream."""
    deadline = time.monotonic() + ANSWER_MS / 1000
    while any(e.ended_s is None for e in exchanges):
        assert time.monotonic() < deadline, [e.path for e in exchanges if e.ended_s is None]
        time.sleep(0.2)
    failed = [
        (e.method, e.path, e.status, e.stream_errors, e.response_head[:300])
        for e in exchanges
        if e.status != 200 or e.stream_errors
    ]
    assert not failed, failed


def user_texts(body: dict[str, Any]) -> list[str]:
    """The text of each user message, whether its content is a string or a list of parts."""
    texts = []
    for message in body["messages"]:
        if message["role"] != "user":
            continue
        content = message["content"]
        if isinstance(content, list):
            content = " ".join(part.get("text", "") for part in content)
        texts.append(content)
    return texts


def test_the_model_list_shows_bubos_models(page: Page, webui: OpenWebUI, artifacts: Path) -> None:
    """The model menu lists the served id and `bubo` (bubo:latest on Ollama), read from /api/tags or /v1/models."""
    menu = open_model_menu(page)
    for name in ("smollm2-135m-instruct-q4-1", "bubo"):
        expect(menu.get_by_role("option", name=f"Select {served_name(webui, name)} model")).to_be_visible()
    page.screenshot(path=artifacts / "models.png")
    menu.get_by_role("option", name=f"Select {served_name(webui, 'bubo')} model").click()
    page.click("#model-selector-model-button")
    page.get_by_role("button", name="Set as default").click()  # for the new chats of the later tests
    page.keyboard.press("Escape")
    expect(page.locator("#model-selector-model-button")).to_contain_text(served_name(webui, "bubo"))
    listed = {e.endpoint for e in webui.exchanges() if e.method == "GET"}
    assert ("/api/tags" if webui.connection == "ollama" else "/v1/models") in listed
    assert_all_ok(webui.exchanges())


def test_a_chat_streams_and_gets_a_title(page: Page, webui: OpenWebUI, artifacts: Path) -> None:
    """The answer appears in several updates; then Open WebUI asks, in the background and not streamed,
    for the chat's title."""
    page.evaluate(WATCH_STREAM)
    since = len(webui.exchanges())
    send(page, "Name three kinds of owl.")
    found = wait_for_chats(webui, since, streamed=1)
    expect(page.get_by_role("button", name="Regenerate").last).to_be_visible(timeout=ANSWER_MS)
    assert last_answer(page)
    seen = page.evaluate("window.seen")
    assert len(seen) >= 3, seen  # it grew while it streamed, not in one piece
    chat = next(e for e in found if json_body(e).get("stream"))
    assert user_texts(json_body(chat))[-1] == "Name three kinds of owl."
    assert json_body(chat)["model"] == served_name(webui, "bubo")
    assert "tools" not in json_body(chat)  # the built-in tools are off for this model
    # the title request: not streamed, with Open WebUI's title task in the last message
    deadline = time.monotonic() + ANSWER_MS / 1000
    while not [e for e in chats(webui, since) if "Generate a concise" in e.body.decode() and e.ended_s]:
        assert time.monotonic() < deadline, [e.body[:200] for e in chats(webui, since)]
        time.sleep(0.2)
    titles = [e for e in chats(webui, since) if "Generate a concise" in e.body.decode()]
    assert [json_body(title).get("stream") for title in titles] == [False]
    page.screenshot(path=artifacts / "chat.png")
    assert_all_ok(chats(webui, since))


def test_a_regenerated_answer_is_a_second_request(page: Page, webui: OpenWebUI, artifacts: Path) -> None:
    """Regenerate → Try Again sends the conversation without the first answer; the page shows the new
    answer as 2 of 2."""
    since = len(webui.exchanges())
    page.get_by_role("button", name="Regenerate").last.click()
    page.get_by_text("Try Again").click()  # its menu: Try Again, Add Details, More Concise
    found = wait_for_chats(webui, since, streamed=1)
    expect(page.get_by_text("2/2")).to_be_visible(timeout=ANSWER_MS)
    again = next(e for e in found if json_body(e).get("stream"))
    assert user_texts(json_body(again)) == ["Name three kinds of owl."]
    assert [m["role"] for m in json_body(again)["messages"]] == ["user"]
    page.screenshot(path=artifacts / "regenerated.png")
    assert_all_ok(found)


def test_a_chat_with_a_system_prompt(page: Page, webui: OpenWebUI, artifacts: Path) -> None:
    """The system prompt set in Chat Controls reaches Bubo as the first message, role system."""
    new_chat(page, webui)
    page.get_by_role("button", name="Controls").click()
    field = page.get_by_placeholder("Enter system prompt")
    field.fill(SYSTEM_PROMPT)
    since = len(webui.exchanges())
    send(page, "Who are you?")
    found = wait_for_chats(webui, since, streamed=1)
    chat = next(e for e in found if json_body(e).get("stream"))
    first = json_body(chat)["messages"][0]
    assert first["role"] == "system"
    assert SYSTEM_PROMPT in first["content"]
    expect(page.get_by_role("button", name="Regenerate").last).to_be_visible(timeout=ANSWER_MS)
    page.screenshot(path=artifacts / "system-prompt.png")
    assert_all_ok(found)


def test_an_uploaded_text_file_reaches_the_model(
    page: Page, webui: OpenWebUI, artifacts: Path, tmp_path: Path
) -> None:
    """A .txt file attached to the message: its text (read by Open WebUI, no embedding) is in the prompt."""
    new_chat(page, webui)
    notes = tmp_path / "field-notes.txt"
    notes.write_text(f"Field notes, night 12.\nThe code word is {CODE_WORD}.\nTwo owls seen near the barn.\n")
    page.locator("input[type=file][multiple]").first.set_input_files(notes)  # the + menu's Upload Files
    expect(page.get_by_text("field-notes.txt").first).to_be_visible()
    wait_until_read(page, "field-notes.txt", CODE_WORD)
    since = len(webui.exchanges())
    send(page, "What is the code word in the file?")
    found = wait_for_chats(webui, since, streamed=1)
    chat = next(e for e in found if json_body(e).get("stream"))
    assert CODE_WORD in json.dumps(json_body(chat)["messages"])
    expect(page.get_by_role("button", name="Regenerate").last).to_be_visible(timeout=ANSWER_MS)
    page.screenshot(path=artifacts / "file.png")
    assert_all_ok(found)


def test_open_webuis_default_36_built_in_tools_fit_the_default_context(
    page: Page, webui: OpenWebUI, artifacts: Path
) -> None:
    """The served id, left as Open WebUI configures it: its built-in tools come with the chat (about
    7,000 tokens with the question), and Bubo answers within the model's own 8,192-token context."""
    new_chat(page, webui)
    menu = open_model_menu(page)
    menu.get_by_role(
        "option", name=f"Select {served_name(webui, 'smollm2-135m-instruct-q4-1')} model"
    ).click()
    since = len(webui.exchanges())
    send(page, "What time is it?")
    found = wait_for_chats(webui, since, streamed=1, within_ms=BUILTIN_TOOLS_MS)
    chat = next(e for e in found if json_body(e).get("stream"))
    tools = json_body(chat)["tools"]
    assert len(tools) > 30, [t["function"]["name"] for t in tools]
    assert {t["type"] for t in tools} == {"function"}
    assert_all_ok(found)
    expect(page.get_by_role("button", name="Regenerate").last).to_be_visible(timeout=BUILTIN_TOOLS_MS)
    page.screenshot(path=artifacts / "builtin-tools.png")


def test_loaded_models_come_from_api_ps_and_eject_frees_the_model(
    page: Page, webui: OpenWebUI, artifacts: Path
) -> None:
    """Through Ollama, each refresh of the model list asks /api/ps which models are loaded: the menu offers
    to eject those; Eject is an empty /api/generate with keep_alive 0, after which /api/ps lists none.
    Through the OpenAI API there is no such poll."""
    page.reload()
    expect(page.locator("#chat-input")).to_be_visible()
    polls = [e for e in webui.exchanges() if e.endpoint == "/api/ps"]
    if webui.connection == "openai":
        assert polls == []
        return
    assert len(polls) >= 2
    assert {m["model"] for m in json.loads(polls[-1].response_head)["models"]} >= {"bubo:latest"}
    menu = open_model_menu(page)
    option = menu.get_by_role("option", name="Select bubo:latest model")
    since = len(webui.exchanges())
    option.get_by_role("button", name="Eject model").click()
    deadline = time.monotonic() + 60
    while not [
        e for e in webui.exchanges()[since:] if e.endpoint == "/api/generate" and e.ended_s is not None
    ]:
        assert time.monotonic() < deadline, [e.path for e in webui.exchanges()[since:]]
        time.sleep(0.2)
    (eject,) = [e for e in webui.exchanges()[since:] if e.endpoint == "/api/generate"]
    assert json_body(eject)["keep_alive"] == 0
    assert json.loads(eject.response_head)["done_reason"] == "unload"
    page.keyboard.press("Escape")
    page.reload()
    expect(page.locator("#chat-input")).to_be_visible()
    menu = open_model_menu(page)
    expect(menu.get_by_role("button", name="Eject model")).to_have_count(0)
    page.screenshot(path=artifacts / "ejected.png")
    page.keyboard.press("Escape")
    assert_all_ok(webui.exchanges()[since:])
