"""Images through a real `bubo serve`: SmolLM2 with a tiny random-weight projector built here.

No registry reachable from here ships a vision model, so ``tests/_tiny_gguf/mmproj.py``
builds a Gemma 3-type projector whose output width is SmolLM2's ``n_embd``.  Its
weights are random: what the model "sees" is noise.  These tests therefore assert
only on shapes, counts, cache reuse, determinism and errors, never on what the
model says about an image.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from PIL import Image
from playwright.sync_api import Page, expect

from .._listener import Listener
from .._pictures import b64, data_uri
from .._tiny_gguf.mmproj import IMAGE_TOKENS, build_mmproj, n_embd_of
from ._webui import (  # noqa: F401 - the shared fixtures
    _browser,
    _errors,
    _page,
    _profile,
    answered,
    chat_bodies,
    open_page,
    set_setting,
)
from .conftest import (
    Server,
    anthropic_client,
    bubo_command,
    free_port,
    openai_client,
    serving,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.llama]


def png(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    """A small PNG whose pixels depend on *seed* (a different seed: a different image)."""
    image = Image.new("RGB", size)
    width, height = size
    image.putdata(
        [
            ((x * 5 + seed * 37) % 256, (y * 7 + seed) % 256, (x + y) % 256)
            for y in range(height)
            for x in range(width)
        ]
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(name="mmproj", scope="module")
def _mmproj(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    return build_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny.gguf", n_embd=n_embd_of(model_path))


@pytest.fixture(name="vision", scope="module")
def _vision(tmp_path_factory: pytest.TempPathFactory, model_path: Path, mmproj: Path) -> Iterator[Server]:
    flags = ("-m", str(model_path), "--mmproj", str(mmproj), "-c", "2048", "-np", "2", "--temp", "0")
    with serving(tmp_path_factory.mktemp("vision") / "serve.log", *flags) as server:
        yield server


@pytest.fixture(name="client")
def _client(vision: Server) -> Iterator[openai.OpenAI]:
    with openai_client(vision) as client:
        yield client


def chat_with(
    client: openai.OpenAI, image: bytes | None, text: str = "What is in this picture?", **fields: object
):
    content: list[dict[str, object]] = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": data_uri(image)}})
    fields.setdefault("max_tokens", 4)
    return client.chat.completions.create(
        model="bubo", messages=[{"role": "user", "content": content}], **fields
    )


class TestOpenAIChat:
    def test_the_image_s_positions_are_prompt_tokens(self, client: openai.OpenAI) -> None:
        without = chat_with(client, None)
        with_image = chat_with(client, png(1))
        assert without.usage is not None
        assert with_image.usage is not None
        # the projector's 4 positions, its <start_of_image>/<end_of_image> text, the joining new line
        assert with_image.usage.prompt_tokens >= without.usage.prompt_tokens + IMAGE_TOKENS
        assert with_image.choices[0].finish_reason in ("length", "stop")

    def test_a_second_turn_over_the_same_image_reads_it_from_the_cache(self, client: openai.OpenAI) -> None:
        first = chat_with(client, png(2), text="Describe it.")
        second = chat_with(client, png(2), text="Describe it.")
        assert first.usage is not None
        assert second.usage is not None
        assert second.usage.prompt_tokens == first.usage.prompt_tokens
        assert second.usage.prompt_tokens_details is not None
        assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1

    def test_another_image_is_read_again_from_where_it_starts(self, client: openai.OpenAI) -> None:
        chat_with(client, png(3), text="Describe it.")
        other = chat_with(client, png(4), text="Describe it.")
        assert other.usage is not None
        assert other.usage.prompt_tokens_details is not None
        # the text before the image is reused; the image and everything after it is read again
        assert other.usage.prompt_tokens_details.cached_tokens <= other.usage.prompt_tokens - IMAGE_TOKENS

    def test_greedy_answers_over_an_image_are_deterministic(self, client: openai.OpenAI) -> None:
        answers = {
            chat_with(client, png(5), max_tokens=8, seed=1).choices[0].message.content for _ in range(2)
        }
        assert len(answers) == 1

    def test_a_url_is_refused_and_never_fetched(self, client: openai.OpenAI) -> None:
        with Listener() as listener, pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="bubo",
                messages=[{"role": "user", "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": f"{listener.url}/cat.png"}},
                ]}],
                max_tokens=4,
            )  # fmt: skip
        assert listener.connections == 0
        assert refused.value.body["param"] == "messages[0].content[1].image_url.url"  # type: ignore[index]

    def test_a_corrupt_image_is_a_400_and_the_server_serves_on(self, client: openai.OpenAI) -> None:
        broken = png(6)[:60]  # a PNG cut short
        with pytest.raises(openai.BadRequestError) as refused:
            chat_with(client, broken)
        assert refused.value.body["param"] == "messages[0].content[1].image_url.url"  # type: ignore[index]
        assert chat_with(client, png(6)).usage is not None


def test_the_model_says_it_takes_images(vision: Server) -> None:
    with httpx.Client(base_url=vision.base_url, timeout=30) as http:
        props = http.get("/props").json()
        models = http.get("/v1/models").json()
    assert props["modalities"]["vision"] is True
    assert "image" in models["data"][0]["architecture"]["input_modalities"]


def test_a_projector_of_another_width_stops_start_up_with_one_clear_line(
    tmp_path: Path, model_path: Path
) -> None:
    wrong = build_mmproj(tmp_path / "mmproj-64.gguf", n_embd=64)
    command = [
        bubo_command(),
        "serve",
        "--port",
        str(free_port()),
        "-m",
        str(model_path),
        "--mmproj",
        str(wrong),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "64" in done.stderr
    assert str(n_embd_of(model_path)) in done.stderr
    assert "Traceback" not in done.stderr


def cached_total(http: httpx.Client) -> int:
    """llama-server's counter of prompt tokens reused from the cache."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_cached_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no llamacpp:prompt_tokens_cached_total in /metrics")


@pytest.fixture(name="http")
def _http(vision: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vision.base_url, timeout=120) as client:
        yield client


class TestEveryDialect:
    """The same image through each dialect's own shape and official client: read, counted, cached."""

    def test_responses_input_image(self, client: openai.OpenAI) -> None:
        def respond() -> openai.types.responses.Response:
            return client.responses.create(
                model="bubo",
                input=[{"role": "user", "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": data_uri(png(10)), "detail": "auto"},
                ]}],
                max_output_tokens=4,
            )  # fmt: skip

        first, second = respond(), respond()
        assert first.usage is not None
        assert second.usage is not None
        assert first.usage.input_tokens > IMAGE_TOKENS
        assert second.usage.input_tokens_details.cached_tokens == second.usage.input_tokens - 1

    def test_anthropic_image_block(self, vision: Server, sdk: contextlib.ExitStack) -> None:
        client = sdk.enter_context(anthropic_client(vision))
        image = {"type": "base64", "media_type": "image/png", "data": b64(png(11))}

        def ask() -> anthropic.types.Message:
            return client.messages.create(
                model="bubo",
                max_tokens=4,
                messages=[{"role": "user", "content": [
                    {"type": "image", "source": image}, {"type": "text", "text": "What is this?"},
                ]}],
            )  # fmt: skip

        first, second = ask(), ask()
        assert first.usage.input_tokens + first.usage.cache_read_input_tokens > IMAGE_TOKENS
        assert second.usage.input_tokens == 1  # all but the last prompt token came from the cache

    def test_a_url_source_is_refused_by_every_dialect_and_never_fetched(
        self, vision: Server, http: httpx.Client
    ) -> None:
        with Listener() as listener:
            url = f"{listener.url}/cat.png"
            refused = [
                http.post("/v1/messages", json={"model": "bubo", "max_tokens": 4, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "?"}]}]}),
                http.post("/v1/responses", json={"model": "bubo", "input": [{"role": "user", "content": [
                    {"type": "input_image", "image_url": url}]}]}),
            ]  # fmt: skip
        assert [r.status_code for r in refused] == [400, 400]
        assert listener.connections == 0

    def test_ollama_chat_and_generate(self, vision: Server, http: httpx.Client) -> None:
        image = png(12)
        client = ollama.Client(host=vision.base_url, timeout=120)
        try:
            ask = {"role": "user", "content": "What is this?", "images": [image]}
            first = client.chat(model="bubo", messages=[ask], options={"num_predict": 4, "temperature": 0})
            before = cached_total(http)
            second = client.chat(model="bubo", messages=[ask], options={"num_predict": 4, "temperature": 0})
            assert first.prompt_eval_count is not None
            assert first.prompt_eval_count > IMAGE_TOKENS
            assert second.prompt_eval_count == first.prompt_eval_count
            assert cached_total(http) - before == second.prompt_eval_count - 1
            generated = client.generate(
                model="bubo", prompt="Describe it.", images=[png(13)], options={"num_predict": 4}
            )
            assert generated.prompt_eval_count is not None
            assert generated.prompt_eval_count > IMAGE_TOKENS
            assert not generated.context  # an answer over images sends no token ids back
        finally:
            client._client.close()

    def test_llama_server_multimodal_data(self, http: httpx.Client) -> None:
        body = {
            "prompt": {"prompt_string": "<__media__>\nDescribe the picture.", "multimodal_data": [
                b64(png(14))]},
            "n_predict": 4,
        }  # fmt: skip
        first = http.post("/completion", json=body).json()
        second = http.post("/completion", json=body).json()
        assert first["tokens_evaluated"] > IMAGE_TOKENS
        assert second["timings"]["cache_n"] == second["tokens_evaluated"] - 1
        assert second["content"] == first["content"]


def test_the_models_dir_layout_serves_a_model_with_its_projector(
    tmp_path: Path, model_path: Path, mmproj: Path
) -> None:
    """llama-server's router layout: a subdirectory with the model and a file named mmproj*."""
    folder = tmp_path / "models" / "smol-vision"
    folder.mkdir(parents=True)
    (folder / model_path.name).symlink_to(model_path)
    (folder / "mmproj-smol.gguf").symlink_to(mmproj)
    port = free_port()
    command = [bubo_command(), "serve", "--port", str(port), "--models-dir", str(tmp_path / "models")]
    server = start_server(command, port, tmp_path / "router.log")
    try:
        with httpx.Client(base_url=server.base_url, timeout=300) as http:
            answer = http.post(
                "/v1/chat/completions",
                json={"model": "smol-vision", "max_tokens": 4, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": data_uri(png(15))}}]}]},
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["prompt_tokens"] > IMAGE_TOKENS
    finally:
        stop_server(server)


def test_the_chat_page_sends_an_attached_image(page: Page, vision: Server, tmp_path: Path) -> None:
    """In Chromium: the image button's picture goes out as an image_url part and the answer comes back."""
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(16))
    open_page(page, vision)
    set_setting(page, "max_tokens", "4")
    page.set_input_files("#attach-file", picture)
    chip = page.locator("#attachments .chip")
    expect(chip.locator("img")).to_be_visible()
    expect(chip).not_to_contain_text("not sent")
    page.fill("#draft", "What is in this picture?")
    bodies = chat_bodies(page)
    with answered(page):
        page.press("#draft", "Enter")
    content = bodies[0]["messages"][-1]["content"]
    assert [part["type"] for part in content] == ["text", "image_url"]
    assert content[1]["image_url"]["url"] == data_uri(png(16))
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("article.assistant").last).not_to_be_empty()
