"""The chat page's features in a real headless Chromium against a real Bubo with the default model.

Rendering (highlighted code, math, tables, copy), attachments (text files, a PDF made here, long
pastes, images), the conversation tree (edit, regenerate, Continue), statistics and prompt progress,
storage (IndexedDB, two tabs, search, export and import, delete with undo, a full quota), settings,
contrast in both themes, and the stream's own failures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from ._webui import (  # noqa: F401 - the shared fixtures
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
    store_conversations,
    watch,
)
from .conftest import Server, free_port, hypercorn_command, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

PDF_TEXT = ["The harbour master keeps a green lantern.", "Its wick is trimmed every evening (at nine)."]
MARKDOWN = (
    "Code:\n\n```python\ndef add(a, b):\n    return a + b  # the sum\n```\n\n"
    "Inline $a^2 + b^2$, display $$\\int_0^1 x\\,dx$$, parens \\(\\frac{1}{2}\\), brackets \\[\\sqrt{2}\\].\n\n"
    "Not math: `$x$` and $5 or $10.\n\n"
    "```text\n\\(y\\) $$z$$\n```\n\n"
    "| name | value |\n|---|---|\n| pi | 3.14 |\n\n- [x] done\n- [ ] to do\n"
)


def make_pdf(lines: list[str]) -> bytes:
    """A one-page PDF (Helvetica) with *lines* of text, its cross-reference table computed here."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    stream = "BT /F1 12 Tf 72 720 Td 16 TL " + " ".join(f"({escape(line)}) Tj T*" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        (
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
            " /Resources << /Font << /F1 5 0 R >> >> >>"
        ),
        f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def count_tokens(server: Server, messages: list[dict]) -> int:
    body = {"model": "bubo", "messages": messages}
    return int(
        httpx.post(f"{server.base_url}/v1/messages/count_tokens", json=body, timeout=30).json()[
            "input_tokens"
        ]
    )


def record_streams(page: Page) -> list[str]:
    """The body of each chat stream from now on, exactly as the server sent it (the browser gets it whole, at its end)."""
    bodies: list[str] = []

    def forward(route: Route) -> None:
        response = route.fetch()
        bodies.append(response.text())
        route.fulfill(response=response)

    page.route("**/v1/chat/completions", forward)
    return bodies


def final_timings(stream: str) -> dict:
    """The ``timings`` of the chunk that carries the finish_reason."""
    chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    return next(c["timings"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"])


def stored_records(page: Page) -> dict[str, list[dict]]:
    """Every conversation and message in the page's IndexedDB, each list sorted by id."""
    return dict(
        page.evaluate(
            """async () => {
              const db = await new Promise((resolve) => { const r = indexedDB.open('bubo', 1); r.onsuccess = () => resolve(r.result); });
              const all = (store) => new Promise((resolve) => { const r = db.transaction(store).objectStore(store).getAll(); r.onsuccess = () => resolve(r.result); });
              const records = { conversations: await all('conversations'), messages: await all('messages') };
              db.close();
              return records;
            }"""
        )
    )


def with_ids_by_position(export: dict) -> dict:
    """*export* with every id (and every link to one) replaced by its position: imports give fresh ids."""
    position: dict[str, str] = {}
    for conversation in export["conversations"]:
        position.setdefault(conversation["id"], f"c{len(position)}")
        for message in conversation["messages"]:
            position.setdefault(message["id"], f"m{len(position)}")

    def renamed(record: dict) -> dict:
        return {
            k: position.get(v, v) if k in ("id", "parent", "leaf", "conversation") else v
            for k, v in record.items()
        }

    return {
        **export,
        "conversations": [
            {**renamed(c), "messages": [renamed(m) for m in c["messages"]]} for c in export["conversations"]
        ],
    }


def stored_answer(page: Page) -> str:
    """The text of the newest answer as the page stored it (its Markdown source)."""
    return str(
        page.evaluate(
            """async () => {
              const db = await new Promise((resolve) => { const r = indexedDB.open('bubo', 1); r.onsuccess = () => resolve(r.result); });
              const all = await new Promise((resolve) => { const r = db.transaction('messages').objectStore('messages').getAll(); r.onsuccess = () => resolve(r.result); });
              db.close();
              return all.filter((m) => m.role === 'assistant').sort((a, b) => a.created - b.created).at(-1).content;
            }"""
        )
    )


class TestRendering:
    def test_code_math_and_tables(self, page: Page, server: Server, artifacts: Path) -> None:
        """Code is highlighted (only the grammars used are loaded), math is typeset in all four delimiters, never in code."""
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        open_page(page, server)
        store_conversations(
            page,
            [[{"role": "user", "content": "Show me"}, {"role": "assistant", "content": MARKDOWN}]],
        )
        content = page.locator("article.assistant .content")
        python = content.locator("code.hljs[data-language='python']")
        expect(python.locator(".hljs-keyword").first).to_have_text("def")
        expect(python.locator(".hljs-comment")).to_have_text("# the sum")
        assert python.text_content() == "def add(a, b):\n    return a + b  # the sum"
        grammars = [url.rsplit("/", 1)[1] for url in requested if "/highlight/languages/" in url]
        assert sorted(grammars) == ["plaintext.min.js", "python.min.js"], grammars
        expect(content.locator(".math")).to_have_count(4)
        annotations = content.locator(".math annotation").all_text_contents()
        assert annotations == ["a^2 + b^2", "\\int_0^1 x\\,dx", "\\frac{1}{2}", "\\sqrt{2}"], annotations
        expect(content.locator(".math-display")).to_have_count(2)
        expect(content.locator(".math-display .katex-display")).to_have_count(2)
        expect(content.locator("p code").first).to_have_text("$x$")  # inside code stays code
        expect(content).to_contain_text("$5 or $10")  # prices are not math
        expect(content.locator("code.hljs[data-language='plaintext']")).to_have_text("\\(y\\) $$z$$")
        expect(content.locator("table th")).to_have_text(["name", "value"])
        expect(content.locator("table td")).to_have_text(["pi", "3.14"])
        expect(content.locator("li")).to_have_text(["☑ done", "☐ to do"])
        assert any(url.endswith("/katex/katex.min.js") for url in requested)
        assert any(url.endswith(".woff2") for url in requested)  # KaTeX's fonts, from this server
        page.locator("article.assistant .copy-message").click()
        assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN
        page.screenshot(path=artifacts / "rendering.png", full_page=True)


class TestAttachments:
    def test_a_pdf_s_text_reaches_the_prompt(
        self, page: Page, server: Server, tmp_path: Path, artifacts: Path
    ) -> None:
        """A PDF's text, read in the browser, is sent as a text part and counted: the meter, count_tokens and /slots agree."""
        pdf = tmp_path / "lantern.pdf"
        pdf.write_bytes(make_pdf(PDF_TEXT))
        open_page(page, server)
        set_setting(page, "max_tokens", "4")
        page.set_input_files("#attach-file", pdf)
        chip = page.locator("#attachments .chip")
        expect(chip).to_contain_text("lantern.pdf")
        page.fill("#draft", "What does the harbour master keep?")
        text = "\n".join(PDF_TEXT)
        part = f"--- lantern.pdf ---\n{text}\n--- end of lantern.pdf ---"
        expected = count_tokens(server, [{"role": "user", "content": [
            {"type": "text", "text": "What does the harbour master keep?"}, {"type": "text", "text": part}]}])  # fmt: skip
        expect(page.locator("#token-count")).to_have_text(f"{expected} / 2048 tokens")
        page.screenshot(path=artifacts / "attachment-pdf.png")
        bodies = chat_bodies(page)
        streams = record_streams(page)
        with answered(page):
            page.press("#draft", "Enter")
        assert bodies[0]["messages"][-1]["content"][1] == {"type": "text", "text": part}
        timings = final_timings(streams[0])
        assert timings["prompt_n"] + timings["cache_n"] == expected  # what the server read
        expect(page.locator("article.user .chip")).to_contain_text("lantern.pdf")
        expect(page.locator("#attachments .chip")).to_have_count(0)

    def test_text_files_long_pastes_and_images(
        self, page: Page, server: Server, tmp_path: Path, artifacts: Path
    ) -> None:
        """A dropped text file and a long paste become chips sent as text; an image is shown but not sent to a text model."""
        open_page(page, server)
        set_setting(page, "max_tokens", "4")
        log = "\n".join(f"12:00:{i % 60:02d} worker {i}: ok" for i in range(400))  # ~10 KB
        page.evaluate(
            """(log) => {
              const data = new DataTransfer();
              data.setData('text/plain', log);
              document.getElementById('draft').dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
              const drop = new DataTransfer();
              drop.items.add(new File(['print("hi")\\n'], 'hello.py', {type: 'text/x-python'}));
              const png = Uint8Array.from(atob('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=='), c => c.charCodeAt(0));
              drop.items.add(new File([png], 'dot.png', {type: 'image/png'}));
              document.getElementById('composer').dispatchEvent(new DragEvent('drop', {dataTransfer: drop, bubbles: true, cancelable: true}));
            }""",
            log,
        )
        chips = page.locator("#attachments .chip")
        expect(chips).to_have_count(3)
        expect(chips.nth(0)).to_contain_text(f"pasted text 1 · {len(log):,} characters")
        expect(chips.nth(1)).to_contain_text("hello.py")
        expect(chips.nth(2).locator("img")).to_be_visible()
        expect(chips.nth(2)).to_contain_text("not sent: this model does not take images")
        assert page.locator("#draft").input_value() == ""  # the paste did not flood the box
        page.screenshot(path=artifacts / "attachments.png")
        page.fill("#draft", "Summarise")
        with_files = [{"type": "text", "text": "Summarise"},
                      {"type": "text", "text": f"--- pasted text 1 ---\n{log}\n--- end of pasted text 1 ---"},
                      {"type": "text", "text": '--- hello.py ---\nprint("hi")\n\n--- end of hello.py ---'}]  # fmt: skip
        expected = count_tokens(server, [{"role": "user", "content": with_files}])
        expect(page.locator("#token-count")).to_have_text(f"{expected} / 2048 tokens")
        chips.nth(1).locator(".chip-remove").click()  # one taken away again
        expect(chips).to_have_count(2)
        bodies = chat_bodies(page)
        with answered(page):
            page.press("#draft", "Enter")
        content = bodies[0]["messages"][-1]["content"]
        assert [part["type"] for part in content] == ["text", "text"]  # the image is not sent
        assert content[1]["text"].startswith("--- pasted text 1 ---\n12:00:00 worker 0: ok")


class TestConversationTree:
    def test_editing_makes_a_branch_that_can_be_navigated_back(
        self, page: Page, server: Server, artifacts: Path
    ) -> None:
        """Editing an earlier question adds a sibling: 2/2 shows the new branch, the previous-version button the old one, whole."""
        open_page(page, server)
        set_setting(page, "max_tokens", "4")
        ask(page, "Name a fruit.")
        ask(page, "Name a vegetable.")
        first_answers = page.locator("article.assistant .content").all_text_contents()
        page.locator("article.user").first.locator(".edit").click()
        box = page.locator("article.user .edit-box")
        expect(box).to_have_value("Name a fruit.")
        box.fill("Name a colour.")
        with answered(page):
            page.locator("article.user .edit-send").click()
        expect(page.locator("article")).to_have_count(2)  # the new branch has no second turn yet
        expect(page.locator("article.user .content")).to_have_text(
            ["Name a colour."]
        )  # a list: it waits while two are shown
        expect(page.locator("article.user .sibling-position")).to_have_text("2/2")
        page.screenshot(path=artifacts / "branches.png")
        page.locator("article.user .sibling-previous").click()
        expect(page.locator("article.user .content")).to_have_text(["Name a fruit.", "Name a vegetable."])
        expect(page.locator("article.assistant .content")).to_have_text(first_answers)
        expect(page.locator("article.user").first.locator(".sibling-position")).to_have_text("1/2")
        page.reload()
        open_page(page, server)  # the chosen branch is kept
        expect(page.locator("article.user .content")).to_have_text(["Name a fruit.", "Name a vegetable."])
        page.locator("article.user").first.locator(".sibling-next").click()
        expect(page.locator("article.user .content")).to_have_text(
            ["Name a colour."]
        )  # a list: it waits while two are shown

    def test_regenerate_and_continue(self, page: Page, server: Server) -> None:
        """Regenerate adds a sibling answer; an answer stopped at the token limit can be continued where it stopped."""
        open_page(page, server)
        set_setting(page, "max_tokens", "6")
        set_setting(page, "temperature", "0")  # sampled freely, the count may end before the limit
        ask(page, "Count from one to twenty in words.")
        answer = page.locator("article.assistant")
        expect(answer.locator(".note")).to_have_text("stopped at the token limit")
        before = stored_answer(page)
        bodies = chat_bodies(page)
        with answered(page):
            answer.locator(".continue").click()
        assert bodies[0]["continue_final_message"] is True
        assert bodies[0]["messages"][-1] == {"role": "assistant", "content": before}
        after = stored_answer(page)
        assert after.startswith(before), (before, after)
        assert len(after) > len(before), (before, after)
        shown = answer.locator(".content").text_content() or ""
        with answered(page):
            answer.locator(".regenerate").click()
        expect(answer.locator(".sibling-position")).to_have_text("2/2")
        answer.locator(".sibling-previous").click()
        expect(answer.locator(".content")).to_have_text(shown)


@pytest.fixture(name="small_batch_server", scope="module")
def _small_batch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose steps carry at most 256 prompt tokens (``--batch-size 256``).

    Alone, a prompt is read in the largest batch the context takes: with the default 2,048 a
    long paste is one step, so nothing is shown between its first report and its end.
    """
    port = free_port()
    log = tmp_path_factory.mktemp("small-batch") / "hypercorn.log"
    server = start_server(
        hypercorn_command(port), port, log, env={"BUBO_BATCH_SIZE": "256", "BUBO_UBATCH_SIZE": "256"}
    )
    yield server
    stop_server(server)


class TestStatistics:
    def test_the_stats_are_the_server_s_timings(self, page: Page, server: Server, artifacts: Path) -> None:
        """Prompt tokens (cached and new), generated tokens and speed are the stream's final timings; the first token's wait too."""
        open_page(page, server)
        set_setting(page, "max_tokens", "8")
        ask(page, "Name a bird.")  # the next question starts from this one's cached prompt
        streams = record_streams(page)
        ask(page, "Name another bird.")
        timings = final_timings(streams[0])
        assert timings["cache_n"] > 0
        stats = page.locator("article.assistant").last.locator(".stats")
        shown = re.fullmatch(
            r"(\d+) prompt tokens \((\d+) cached, (\d+) new, read in (\d+) ms\)",
            stats.locator(".stat-prompt").text_content() or "",
        )
        assert shown, stats.text_content()
        prompt = timings["prompt_n"] + timings["cache_n"]
        assert [int(g) for g in shown.groups()[:3]] == [prompt, timings["cache_n"], timings["prompt_n"]]
        assert abs(int(shown[4]) - timings["prompt_ms"]) <= 0.5  # shown to the millisecond
        expect(stats.locator(".stat-generated")).to_have_text(f"{timings['predicted_n']} tokens generated")
        speed = float((stats.locator(".stat-speed").text_content() or "").removesuffix(" tokens/s"))
        assert abs(speed - timings["predicted_per_second"]) <= 0.05  # shown to a tenth
        expect(stats.locator(".stat-ttft")).to_have_text(re.compile(r"first token after \d+ ms"))
        page.screenshot(path=artifacts / "statistics.png")

    def test_a_long_prompt_shows_its_progress(
        self, page: Page, small_batch_server: Server, artifacts: Path
    ) -> None:
        """While a long prompt is read (return_progress), a bar shows the share read and an estimate of the time left."""
        open_page(page, small_batch_server)
        set_setting(page, "max_tokens", "2")
        page.evaluate(
            """() => {
              window.progress = [];
              const bar = document.getElementById('progress-bar');
              const box = document.getElementById('progress');
              new MutationObserver(() => {
                if (!box.hidden) window.progress.push([bar.value, document.getElementById('progress-text').textContent]);
              }).observe(box, {attributes: true, childList: true, subtree: true});
            }"""
        )
        long_text = " ".join(
            f"Line {i} of the report says the harbour is calm." for i in range(110)
        )  # ~1,400 tokens
        page.evaluate(
            """(text) => { const data = new DataTransfer(); data.setData('text/plain', text);
              document.getElementById('draft').dispatchEvent(
                new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true})); }""",
            long_text,
        )
        page.fill("#draft", "Summarise the report.")
        with answered(page):
            page.press("#draft", "Enter")
            expect(page.locator("#progress")).to_be_visible()
            page.screenshot(path=artifacts / "prompt-progress.png")
        progress = page.evaluate("window.progress")
        assert any(0 < value < 1 for value, _text in progress), progress
        assert any(
            re.fullmatch(r"Reading the prompt: \d+ / \d+ tokens( \(\d+ cached\))? · about \d+ s left", t)
            for _v, t in progress
        ), progress
        expect(page.locator("#progress")).to_be_hidden()


class TestStorage:
    def test_conversations_live_in_indexeddb(self, page: Page, server: Server) -> None:
        """A conversation survives a reload; rename, new chat, search, delete and its undo; nothing in localStorage."""
        open_page(page, server)
        set_setting(page, "max_tokens", "4")
        ask(page, "Name a colour.")
        answer = page.locator("article.assistant .content").text_content()
        page.reload()
        open_page(page, server)
        expect(page.locator("article.user .content")).to_have_text("Name a colour.")
        expect(page.locator("article.assistant .content")).to_have_text(answer or "")
        assert "conversations" not in json.dumps(page.evaluate("Object.keys(localStorage)"))
        page.once("dialog", lambda dialog: dialog.accept("Colours"))
        page.click("#conversations li.current .rename")
        expect(page.locator("#conversations li.current .open")).to_have_text("Colours")
        page.click("#new-chat")
        expect(page.locator("#conversations li")).to_have_count(2)
        expect(page.locator("article")).to_have_count(0)
        page.fill("#search", "colour")  # the message's text, not only titles
        expect(page.locator("#conversations li")).to_have_count(1)
        page.fill("#search", "no such words")
        expect(page.locator("#conversations li")).to_have_text(["No conversation matches."])
        page.fill("#search", "")
        page.click("#conversations li:has-text('Colours') .open")
        page.click("#conversations li.current .delete")
        expect(page.locator("#conversations li")).to_have_count(1)
        expect(page.locator("#toast")).to_contain_text("Deleted “Colours”.")
        page.click("#toast-undo")
        expect(page.locator("#conversations li")).to_have_count(2)
        page.click("#conversations li:has-text('Colours') .open")
        expect(page.locator("article.user .content")).to_have_text("Name a colour.")
        expect(page.locator("article.assistant .content")).to_have_text(answer or "")

    def test_two_tabs_never_overwrite_each_other(self, page: Page, server: Server, errors: list[str]) -> None:
        """Two tabs each write their own conversation; both are kept, and each tab hears of the other's."""
        open_page(page, server)
        other = watch(page.context.new_page(), errors)
        open_page(other, server)
        set_setting(page, "max_tokens", "4")
        set_setting(other, "max_tokens", "4")
        other.click("#new-chat")  # each tab its own conversation, both started before either has written
        ask(page, "Tab one speaking.")
        ask(other, "Tab two speaking.")
        for tab in (page, other):
            expect(tab.locator("#conversations li")).to_have_count(2)
            expect(tab.locator("#conversations")).to_contain_text("Tab one speaking.")
            expect(tab.locator("#conversations")).to_contain_text("Tab two speaking.")
        page.reload()
        open_page(page, server)
        expect(page.locator("#conversations li")).to_have_count(2)

    def test_export_then_import_into_a_fresh_profile(
        self, page: Page, browser: Browser, server: Server, tmp_path: Path, errors: list[str]
    ) -> None:
        """Export all writes every conversation with its branches; importing it into an empty profile gives the same export."""
        open_page(page, server)
        store_conversations(page, [
            [{"role": "user", "content": "First"}, {"role": "assistant", "content": "**One**", "finish_reason": "stop"}],
            [{"role": "user", "content": "Second"}, {"role": "assistant", "content": "Two"}],
        ])  # fmt: skip
        with page.expect_download() as download_info:
            page.click("#export-all")
        exported = tmp_path / "all.json"
        download_info.value.save_as(exported)
        original = json.loads(exported.read_text())
        assert original["format"] == "bubo.conversations"
        assert len(original["conversations"]) == 2
        fresh = browser.new_context(viewport={"width": 1100, "height": 720})
        try:
            other = watch(fresh.new_page(), errors)
            open_page(other, server)
            other.set_input_files("#import-file", exported)
            expect(other.locator("#conversations li")).to_have_count(3)  # with its own empty new chat
            with other.expect_download() as again_info:
                other.click("#export-all")
            again = tmp_path / "again.json"
            again_info.value.save_as(again)
            imported = json.loads(again.read_text())
            assert with_ids_by_position(imported) == with_ids_by_position(original)
            assert not {c["id"] for c in imported["conversations"]} & {
                c["id"] for c in original["conversations"]
            }
            other.click("#conversations li:has-text('First') .open")
            expect(other.locator("article.assistant .content strong")).to_have_text("One")
            other.set_input_files("#import-file", exported)  # again: new ids, nothing overwritten
            expect(other.locator("#conversations li")).to_have_count(5)
        finally:
            fresh.close()

    def test_an_import_never_touches_another_conversation(
        self, page: Page, server: Server, tmp_path: Path
    ) -> None:
        """A file reusing a stored conversation's ids (its own, or only its messages') imports under fresh ids.

        Both stored and imported conversations are whole afterwards; a crafted loop of parents opens.
        """
        open_page(page, server)
        store_conversations(
            page,
            [[{"role": "user", "content": "Kept question"}, {"role": "assistant", "content": "Kept answer"}]],
        )
        before = stored_records(page)
        crafted = {"format": "bubo.conversations", "version": 1, "conversations": [
            {"id": "c0", "title": "Same id", "leaf": "m0-1", "system": "", "created": 5, "updated": 300, "messages": [
                {"id": "m0-0", "role": "user", "content": "Same question", "parent": None, "created": 1},
                {"id": "m0-1", "role": "assistant", "content": "Same answer", "parent": "m0-0", "created": 2},
            ]},
            {"id": "c-new", "title": "Loop", "leaf": "m0-1", "system": "", "created": 6, "updated": 200, "messages": [
                {"id": "m0-0", "role": "user", "content": "Loop question", "parent": "m0-1", "created": 1},
                {"id": "m0-1", "role": "assistant", "content": "Loop answer", "parent": "m0-0", "created": 2},
            ]},
        ]}  # fmt: skip
        path = tmp_path / "crafted.json"
        path.write_text(json.dumps(crafted))
        page.set_input_files("#import-file", path)
        expect(page.locator("#announce")).to_have_text("Imported 2 conversations.")
        after = stored_records(page)
        assert [c for c in after["conversations"] if c["id"] == "c0"] == [
            c for c in before["conversations"] if c["id"] == "c0"
        ]
        assert [m for m in after["messages"] if m["conversation"] == "c0"] == before["messages"]
        earlier = {c["id"] for c in before["conversations"]}  # c0 and the page's empty new chat
        new = [c for c in after["conversations"] if c["id"] not in earlier]
        assert sorted(c["title"] for c in new) == ["Loop", "Same id"]
        assert not {c["id"] for c in new} & {"c0", "c-new"}
        messages = [m for m in after["messages"] if m["conversation"] != "c0"]
        assert len(messages) == 4
        assert not {m["id"] for m in messages} & {"m0-0", "m0-1"}
        for conversation in new:
            own = {m["id"] for m in messages if m["conversation"] == conversation["id"]}
            assert len(own) == 2
            assert conversation["leaf"] in own
            assert all(
                m["parent"] in own | {None} for m in messages if m["conversation"] == conversation["id"]
            )
        page.click("#conversations li:has-text('Same id') .open")
        expect(page.locator("article .content")).to_have_text(["Same question", "Same answer"])
        page.click("#conversations li:has-text('Loop') .open")  # the link closing the loop was cut: a root
        expect(page.locator("article .content")).to_have_text(["Loop answer"])
        page.click("#conversations li:has-text('Kept question') .open")
        expect(page.locator("article .content")).to_have_text(["Kept question", "Kept answer"])

    def test_a_full_storage_quota_is_an_error_and_keeps_the_message(self, page: Page, server: Server) -> None:
        """With the storage full, sending says so, sends nothing, and leaves the typed text in the box; then it goes."""
        # Chromium's quota override (DevTools' Storage.overrideQuotaForOrigin) does not refuse small IndexedDB
        # writes, so the browser's refusal is played here: a write throws QuotaExceededError, as a full quota makes it.
        page.add_init_script(
            """(() => {
              const put = IDBObjectStore.prototype.put;
              IDBObjectStore.prototype.put = function (...args) {
                if (window.storageFull) throw new DOMException('The quota has been exceeded.', 'QuotaExceededError');
                return put.apply(this, args);
              };
            })()"""
        )
        open_page(page, server)
        set_setting(page, "max_tokens", "4")
        page.evaluate("window.storageFull = true")
        bodies = chat_bodies(page)
        page.fill("#draft", "Please keep this text.")
        page.press("#draft", "Enter")
        expect(page.locator("#error")).to_contain_text("storage for this page is full")
        expect(page.locator("#error")).to_contain_text("your message is still in the box")
        expect(page.locator("#draft")).to_have_value("Please keep this text.")
        expect(page.locator("article")).to_have_count(0)
        assert bodies == []
        page.evaluate("window.storageFull = false")  # space again: the same text goes
        with answered(page):
            page.press("#draft", "Enter")
        expect(page.locator("article.user .content")).to_have_text("Please keep this text.")
        expect(page.locator("#draft")).to_have_value("")


class TestSettings:
    def test_every_sampler_and_the_custom_json_reach_the_request(
        self, page: Page, server: Server, artifacts: Path
    ) -> None:
        """Each sampler field is sent as a number, reasoning effort as chosen, custom JSON merged last; kept per browser."""
        open_page(page, server)
        values = {
            "temperature": "0.7", "top_k": "30", "top_p": "0.9", "min_p": "0.05", "typical_p": "0.95",
            "top_n_sigma": "2", "dynatemp_range": "0.1", "dynatemp_exponent": "1.2", "seed": "42", "max_tokens": "5",
            "repeat_penalty": "1.1", "repeat_last_n": "64", "presence_penalty": "0.1", "frequency_penalty": "0.2",
            "dry_multiplier": "0.5", "dry_base": "1.75", "dry_allowed_length": "2", "dry_penalty_last_n": "128",
            "xtc_probability": "0.1", "xtc_threshold": "0.2", "mirostat": "0", "mirostat_tau": "5", "mirostat_eta": "0.1",
        }  # fmt: skip
        page.click("#open-settings")
        expect(page.locator("#settings-dialog")).to_be_visible()
        for key, value in values.items():
            page.fill(f"#setting-{key}", value)
        page.select_option("#setting-reasoning_effort", "low")
        page.fill("#setting-custom_json", '{"n_probs": 2, "temperature": 0.5}')
        page.screenshot(path=artifacts / "settings.png")
        page.click("#settings-close")
        bodies = chat_bodies(page)
        ask(page, "Hello")
        expect(page.locator("#error")).to_be_hidden()  # the server took every field
        body = bodies[0]
        for key, value in values.items():
            expected = 0.5 if key == "temperature" else (float(value) if "." in value else int(value))
            assert body[key] == expected, key
        assert body["reasoning_effort"] == "low"
        assert body["n_probs"] == 2
        assert body["return_progress"] is True
        page.reload()
        page.click("#open-settings")
        expect(page.locator("#setting-top_k")).to_have_value("30")
        page.fill("#setting-custom_json", "{not json")
        page.click("#settings-close")
        page.fill("#draft", "Hello again")
        page.press("#draft", "Enter")
        expect(page.locator("#error")).to_contain_text("the custom JSON is not valid JSON")

    def test_a_conversation_has_its_own_system_prompt(self, page: Page, server: Server) -> None:
        """The system prompt belongs to the conversation: it is sent with it, and a new chat starts without it."""
        open_page(page, server)
        set_setting(page, "max_tokens", "4")
        page.click("#conversation-system summary")
        page.fill("#system-prompt", "You answer in French.")
        page.locator("#system-prompt").blur()
        bodies = chat_bodies(page)
        ask(page, "Hello")
        assert bodies[0]["messages"][0] == {"role": "system", "content": "You answer in French."}
        page.click("#new-chat")
        expect(page.locator("#system-prompt")).to_have_value("")
        page.click("#conversations li:has-text('Hello') .open")
        expect(page.locator("#system-prompt")).to_have_value("You answer in French.")


CONTRAST = """() => {
  const parse = (c) => { const m = c.match(/[\\d.]+/g).map(Number); return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; };
  const lum = ({r, g, b}) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const over = (top, bottom) => ({r: top.r * top.a + bottom.r * (1 - top.a), g: top.g * top.a + bottom.g * (1 - top.a),
    b: top.b * top.a + bottom.b * (1 - top.a), a: 1});
  const background = (node) => {
    const layers = [];
    for (let n = node; n && n.nodeType === 1; n = n.parentElement) {
      const c = parse(getComputedStyle(n).backgroundColor);
      if (c.a > 0) layers.push(c);
      if (c.a >= 1) break;
    }
    return layers.reduceRight((acc, layer) => over(layer, acc), {r: 255, g: 255, b: 255, a: 1});
  };
  const results = [];
  for (const node of document.querySelectorAll('body *')) {
    if (!node.checkVisibility() || node.closest('[disabled], .katex-mathml')) continue;
    const text = [...node.childNodes].filter((c) => c.nodeType === 3).map((c) => c.data).join('').trim();
    if (!text) continue;
    const bg = background(node);
    const fg = over(parse(getComputedStyle(node).color), bg);
    const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    results.push({text: text.slice(0, 30), tag: node.tagName, className: String(node.className), ratio: (a + 0.05) / (b + 0.05)});
  }
  return results;
}"""


class TestAccessibility:
    @pytest.mark.parametrize("theme", ["light", "dark"])
    def test_every_text_has_a_contrast_of_4_5(
        self, page: Page, server: Server, theme: str, artifacts: Path
    ) -> None:
        """Each visible text's colour against its computed background is at least 4.5:1, in the theme chosen and as the system's."""
        page.emulate_media(color_scheme=theme)  # the theme "system" follows it
        open_page(page, server)
        store_conversations(page, [[{"role": "user", "content": "Show me"}, {"role": "assistant", "content": MARKDOWN,
            "note": "stopped at the token limit", "finish_reason": "length",
            "stats": {"timings": {"prompt_n": 9, "cache_n": 3, "prompt_ms": 20, "predicted_n": 5, "predicted_per_second": 50}, "ttft_ms": 40}}]])  # fmt: skip
        expect(page.locator("code.hljs[data-language='python']")).to_be_visible()
        expect(page.locator(".math .katex").first).to_be_visible()
        page.fill("#draft", "draft")
        for chosen in ("system", theme):
            set_setting(page, "theme", chosen)
            low = [r for r in page.evaluate(CONTRAST) if r["ratio"] < 4.5]
            assert not low, low
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == {"light": "rgb(247, 247, 248)", "dark": "rgb(23, 23, 26)"}[theme]
        page.screenshot(path=artifacts / f"theme-{theme}.png")


class TestStreamFailures:
    def test_a_stream_that_ends_early_is_marked_incomplete(self, page: Page, server: Server) -> None:
        """A stream cut before finish_reason and [DONE] (here by a proxy in the browser) is marked incomplete, not complete."""
        open_page(page, server)
        set_setting(page, "max_tokens", "8")

        def cut(route: Route) -> None:
            body = route.fetch().text()
            frames = [f for f in body.split("\n\n") if f and '"finish_reason":null' in f.replace(" ", "")]
            route.fulfill(
                status=200,
                headers={"Content-Type": "text/event-stream"},
                body="\n\n".join(frames[:3]) + "\n\n",
            )

        page.route("**/v1/chat/completions", cut)
        ask(page, "Hello")
        expect(page.locator("article.assistant .note")).to_have_text(
            "incomplete: the stream ended before the answer did"
        )
        expect(page.locator("#error")).to_contain_text("The connection ended before the answer was complete")
        expect(page.locator("#announce")).to_have_text("The answer failed.")

    def test_an_unreadable_event_ends_the_request(self, page: Page, server: Server) -> None:
        """An event that is not JSON stops the request there: nothing after it is shown, and the page says why."""
        open_page(page, server)
        set_setting(page, "max_tokens", "8")

        def corrupt(route: Route) -> None:
            frames = [f for f in route.fetch().text().split("\n\n") if f]
            route.fulfill(status=200, headers={"Content-Type": "text/event-stream"},
                          body="\n\n".join([frames[0], frames[1], "data: {not json", *frames[2:]]) + "\n\n")  # fmt: skip

        page.route("**/v1/chat/completions", corrupt)
        ask(page, "Hello")
        expect(page.locator("#error")).to_contain_text(
            "The server sent an event the page cannot read, so the request was stopped: {not json"
        )
        assert (
            page.locator("article.assistant .stats").count() == 0
        )  # the final chunk after it was never read

    def test_a_reader_who_scrolled_up_stays_there(self, page: Page, server: Server) -> None:
        """While an answer streams, a reader who scrolled up is not pulled down to the end."""
        open_page(page, server)
        history = [m for i in range(12) for m in ({"role": "user", "content": f"Question {i}"},
                   {"role": "assistant", "content": "A long answer.\n\n" * 12})]  # fmt: skip
        store_conversations(page, [history])
        set_setting(page, "max_tokens", "40")
        messages = page.locator("#messages")
        with answered(page):
            page.fill("#draft", "Tell me about owls.")
            page.press("#draft", "Enter")
            expect(page.locator("#stop")).to_be_visible()
            messages.evaluate("m => { m.scrollTop = 100; }")
        assert messages.evaluate("m => m.scrollTop") == 100
