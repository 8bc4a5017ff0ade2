"""Images in every dialect's own wire shape, over the fake engine's :class:`FakeVision`.

FakeVision decodes each image as the real engine does (Pillow, bounded) and
stands for it with four stand-in ids drawn from its pixels; these tests check
that each dialect's image reaches it, lands where the dialect places it in the
prompt, and that every bad image is a 400 naming its field.  A URL is never
fetched (tests/api/test_no_outbound_fetch.py listens for it).  The real
projector is exercised in tests/engine and the e2e tests.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest
from tests._pictures import CORRUPT_PNG, b64, data_uri, png
from tests.conftest import wait_until_ready

from bubo.api._converter import make_converter, structure
from bubo.api.anthropic import translate as anthropic_translate
from bubo.api.anthropic import wire as anthropic_wire
from bubo.api.ollama import translate as ollama_translate
from bubo.api.ollama import wire as ollama_wire
from bubo.api.responses.translate import IMAGE_NOT_KEPT
from bubo.domain.generation import GenerationRequest
from bubo.domain.media import DEFAULT_MEDIA_MARKER
from bubo.engine.fake import FakeEngine, FakeVision
from bubo.errors import InvalidRequest
from bubo.server import create_app
from bubo.tokenizer import HFTokenizer

RED, BLUE = png((200, 30, 30)), png((30, 30, 200))
NOT_BASE64 = "not base64!"


def texts_around_images(tokenizer: HFTokenizer, request: GenerationRequest) -> list[str]:
    """The prompt's text before, between and after its images, which must hold their stand-in ids."""
    tokens = request.prompt_tokens
    out, start = [], 0
    for placed in request.images:
        assert tokens[placed.at : placed.end] == placed.image.tokens  # FakeVision's run is all stand-ins
        out.append(tokenizer.decode(list(tokens[start : placed.at])))
        start = placed.end
    out.append(tokenizer.decode(list(tokens[start:])))
    return out


def read_in_order(vision: FakeVision, request: GenerationRequest, n: int) -> None:
    """The last *n* images FakeVision read are the request's, in prompt order."""
    assert len(request.images) == n
    assert [placed.image for placed in request.images] == vision.read[-n:]
    assert all(t < 0 for placed in request.images for t in placed.image.tokens)


async def error_of(app: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 400, await response.get_data()
    payload = await response.get_json()
    return payload["error"] if isinstance(payload["error"], dict) else payload


# ---- Responses ------------------------------------------------------------------------------

RESPONSES = "/v1/responses"


def responses_body(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    content = [{"type": "input_text", "text": "What is it?"}, *parts]
    return {
        "model": "bubo",
        "max_output_tokens": 4,
        "input": [{"role": "user", "content": content}],
        **fields,
    }


class TestResponses:
    async def test_input_image_reaches_the_model(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        """Two input_image parts are read in order, each where its part is."""
        body = responses_body(
            {"type": "input_image", "image_url": data_uri(RED)},
            {"type": "input_text", "text": "and"},
            {"type": "input_image", "image_url": data_uri(BLUE), "detail": "low"},
        )
        response = await vision_app.test_client().post(RESPONSES, json=body)
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 2)
        assert vision.read[0].digest != vision.read[1].digest
        before, between, _after = texts_around_images(tokenizer, request)
        assert before.endswith("What is it?\n")
        assert between == "\nand\n"

    @pytest.mark.parametrize(
        ("part", "param", "code"),
        [
            ({"image_url": "https://example.com/owl.png"}, "input[0].content[1].image_url", "image_url_not_supported"),
            ({"file_id": "file-abc"}, "input[0].content[1].file_id", "image_url_not_supported"),
            ({}, "input[0].content[1].image_url", "invalid_request"),
            ({"image_url": "data:image/png;base64," + NOT_BASE64}, "input[0].content[1].image_url", "invalid_request"),
            ({"image_url": data_uri(CORRUPT_PNG)}, "input[0].content[1].image_url", "invalid_request"),
        ],
    )  # fmt: skip
    async def test_a_bad_image_is_a_400_naming_it(
        self, vision_app, vision: FakeVision, part: dict[str, Any], param: str, code: str
    ) -> None:
        error = await error_of(vision_app, RESPONSES, responses_body({"type": "input_image", **part}))
        assert (error["code"], error["param"]) == (code, param)

    async def test_a_continuation_reads_a_placeholder_for_an_earlier_image(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        """The store keeps text: the next turn reads a placeholder, never the request's marker."""
        client = vision_app.test_client()
        first = await client.post(
            RESPONSES, json=responses_body({"type": "input_image", "image_url": data_uri(RED)})
        )
        assert first.status_code == 200
        following = {"model": "bubo", "max_output_tokens": 4, "input": "And now?"}
        following["previous_response_id"] = (await first.get_json())["id"]
        second = await client.post(RESPONSES, json=following)
        assert second.status_code == 200, await second.get_data()
        request = vision_engine.requests[-1]
        assert request.images == ()
        assert len(vision.read) == 1
        prompt = tokenizer.decode(list(request.prompt_tokens))
        assert IMAGE_NOT_KEPT in prompt
        assert re.search(r"<__media_[0-9a-f]+__>", prompt) is None


# ---- Anthropic ------------------------------------------------------------------------------

MESSAGES = "/v1/messages"


def image_block(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


def base64_source(data: bytes | str) -> dict[str, Any]:
    return {"type": "base64", "media_type": "image/png", "data": data if isinstance(data, str) else b64(data)}


def messages_body(*blocks: dict[str, Any]) -> dict[str, Any]:
    content = [*blocks, {"type": "text", "text": "What is it?"}]
    return {"model": "bubo", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}


class TestAnthropic:
    async def test_a_base64_image_block_reaches_the_model(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        response = await vision_app.test_client().post(
            MESSAGES, json=messages_body(image_block(base64_source(RED)))
        )
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 1)
        assert texts_around_images(tokenizer, request)[1].startswith("\nWhat is it?")

    async def test_an_image_in_a_tool_result_reaches_the_model(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine
    ) -> None:
        """A screenshot tool's result is read like any image."""
        body = {
            "model": "bubo",
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": "Take a screenshot."},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "here"}, image_block(base64_source(BLUE))],
                        }
                    ],
                },
            ],
        }
        response = await vision_app.test_client().post(MESSAGES, json=body)
        assert response.status_code == 200, await response.get_data()
        read_in_order(vision, vision_engine.requests[-1], 1)

    @pytest.mark.parametrize(
        ("source", "param", "code"),
        [
            ({"type": "url", "url": "https://example.com/owl.png"}, "messages[0].content[0].source", "image_url_not_supported"),
            ({"type": "file", "file_id": "file_011"}, "messages[0].content[0].source", "image_url_not_supported"),
            ({}, "messages[0].content[0].source", "invalid_request"),
            ({"type": "base64", "media_type": "image/png"}, "messages[0].content[0].source.data", "invalid_request"),
            (base64_source(NOT_BASE64), "messages[0].content[0].source.data", "invalid_request"),
            (base64_source(CORRUPT_PNG), "messages[0].content[0].source.data", "invalid_request"),
        ],
    )  # fmt: skip
    async def test_a_bad_image_is_a_400_naming_it(
        self, vision_app, vision: FakeVision, source: dict[str, Any], param: str, code: str
    ) -> None:
        error = await error_of(vision_app, MESSAGES, messages_body(image_block(source)))
        # the envelope has no param: the field is named where the request is read
        assert (error["type"], error["code"]) == ("invalid_request_error", code)
        if source.get("data") != b64(CORRUPT_PNG):  # a corrupt image is found where it is decoded
            body = structure(
                make_converter(), messages_body(image_block(source)), anthropic_wire.MessagesRequest
            )
            with pytest.raises(InvalidRequest) as caught:
                anthropic_translate.messages_request(body, takes_images=True)
            assert caught.value.param == param

    async def test_count_tokens_reads_no_image(self, vision_app, vision: FakeVision) -> None:
        """As the contract says, count_tokens does not take images: the newest turn's is a 400, none is read."""
        body = messages_body(image_block(base64_source(RED)))
        del body["max_tokens"]
        error = await error_of(vision_app, f"{MESSAGES}/count_tokens", body)
        assert error["code"] == "unsupported_content"
        earlier = {"model": "bubo", "messages": [*body["messages"], {"role": "assistant", "content": "A red square."}, {"role": "user", "content": "Sure?"}]}  # fmt: skip
        response = await vision_app.test_client().post(f"{MESSAGES}/count_tokens", json=earlier)
        assert response.status_code == 200
        assert response.headers["Bubo-Omitted-Content"] == "image=1"
        assert vision.read == []


# ---- Ollama ---------------------------------------------------------------------------------


def ollama_chat(content: str, *images: bytes | str, **fields: Any) -> dict[str, Any]:
    sent = [i if isinstance(i, str) else b64(i) for i in images]
    message = {"role": "user", "content": content, "images": sent}
    return {"model": "bubo", "stream": False, "options": {"num_predict": 4}, "messages": [message], **fields}


def ollama_generate(prompt: str, *images: bytes | str, **fields: Any) -> dict[str, Any]:
    sent = [i if isinstance(i, str) else b64(i) for i in images]
    return {
        "model": "bubo",
        "stream": False,
        "options": {"num_predict": 4},
        "prompt": prompt,
        "images": sent,
        **fields,
    }


class TestOllama:
    async def test_chat_images_go_before_the_text(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        """As Ollama writes ``[img-0][img-1]`` in front of the message's text."""
        response = await vision_app.test_client().post(
            "/api/chat", json=ollama_chat("Compare them.", RED, BLUE)
        )
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 2)
        assert vision.read[0].digest != vision.read[1].digest  # RED first
        _, between, after = texts_around_images(tokenizer, request)
        assert between == ""
        assert after.startswith("Compare them.")

    async def test_img_slots_place_the_images(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        """Each ``[img]`` in the text takes the next image; images left over go in front."""
        body = ollama_chat("Is [img] darker than [img]?", RED, BLUE, RED)
        response = await vision_app.test_client().post("/api/chat", json=body)
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 3)
        in_front, first, second = (image.digest for image in vision.read)  # images[2], [0], [1]
        assert in_front == first != second
        before, *between, after = texts_around_images(tokenizer, request)
        assert before.endswith("user\n")
        assert between == ["Is ", " darker than "]
        assert after.startswith("?")

    @pytest.mark.parametrize(
        ("image", "words"), [(NOT_BASE64, "not valid base64"), (CORRUPT_PNG, "not an image")]
    )
    async def test_a_bad_image_is_a_400(self, vision_app, image: bytes | str, words: str) -> None:
        """Ollama's error is its message alone (the field is named in the other dialects)."""
        error = await error_of(vision_app, "/api/chat", ollama_chat("What?", RED, image))
        assert words in error["error"]

    def test_bad_base64_names_its_field(self) -> None:
        body = structure(make_converter(), ollama_chat("What?", RED, NOT_BASE64), ollama_wire.ChatRequest)
        with pytest.raises(InvalidRequest) as caught:
            ollama_translate.chat_request(body, takes_images=True)
        assert caught.value.param == "messages[0].images[1]"

    async def test_generate_places_the_images_and_sends_no_context(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        """An image's stand-in ids are no tokens: an answer over images has no context to send back."""
        response = await vision_app.test_client().post(
            "/api/generate", json=ollama_generate("What is it?", RED)
        )
        assert response.status_code == 200, await response.get_data()
        body = await response.get_json()
        assert body["done"] is True
        assert "context" not in body
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 1)
        assert texts_around_images(tokenizer, request)[1].startswith("What is it?")

    async def test_generate_with_a_context_and_an_image(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine
    ) -> None:
        """A text answer's context goes in front of a turn with an image; the image's place moves with it."""
        client = vision_app.test_client()
        first = await (await client.post("/api/generate", json=ollama_generate("Hello"))).get_json()
        context = first["context"]
        assert all(t >= 0 for t in context)
        response = await client.post("/api/generate", json=ollama_generate("And this?", RED, context=context))
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        assert request.prompt_tokens[: len(context)] == tuple(context)
        read_in_order(vision, request, 1)
        placed = request.images[0]
        assert placed.at > len(context)
        assert request.prompt_tokens[placed.at : placed.end] == placed.image.tokens

    async def test_raw_generate_places_each_image_at_its_tag(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        """``[img-N]`` places images[N]; a tag naming no image stays text."""
        body = ollama_generate("B:[img-1] A:[img-0] [img-7]", RED, BLUE, raw=True)
        response = await vision_app.test_client().post("/api/generate", json=body)
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 2)
        blue_first = vision.read[-2]
        assert blue_first.digest != vision.read[-1].digest
        _, between, after = texts_around_images(tokenizer, request)
        assert (between, after) == (" A:", " [img-7]")
        assert "context" not in await response.get_json()

    async def test_raw_generate_without_the_tag_of_an_image_is_a_400(
        self, vision_app, vision: FakeVision
    ) -> None:
        response = await vision_app.test_client().post(
            "/api/generate", json=ollama_generate("[img-1]", RED, BLUE, raw=True)
        )
        assert response.status_code == 400
        assert "[img-0]" in (await response.get_json())["error"]
        assert vision.read == []

    async def test_fill_in_the_middle_takes_no_images(self, vision_app) -> None:
        response = await vision_app.test_client().post(
            "/api/generate", json=ollama_generate("def f(", RED, suffix=")")
        )
        assert response.status_code == 400
        assert "images" in (await response.get_json())["error"]

    async def test_show_says_vision(self, app, vision_app) -> None:
        """``capabilities`` holds ``vision`` with a projector only."""
        seen = []
        for one in (app, vision_app):
            response = await one.test_client().post("/api/show", json={"model": "bubo"})
            seen.append((await response.get_json())["capabilities"])
        assert seen == [["completion", "tools"], ["completion", "vision", "tools"]]

    async def test_a_text_model_refuses_images(self, app) -> None:
        """Today's answer: a 400 naming the images, in any turn."""
        body = ollama_chat("What?", RED)
        body["messages"].append({"role": "user", "content": "Well?"})
        response = await app.test_client().post("/api/chat", json=body)
        assert response.status_code == 400
        assert "image" in (await response.get_json())["error"]
        raw = await app.test_client().post("/api/generate", json=ollama_generate("[img-0]", RED, raw=True))
        assert raw.status_code == 400


# ---- llama-server ---------------------------------------------------------------------------


def multimodal(text: str, *images: bytes | str) -> dict[str, Any]:
    return {"prompt_string": text, "multimodal_data": [i if isinstance(i, str) else b64(i) for i in images]}


class TestLlamaServer:
    async def test_multimodal_data_reaches_the_model_at_its_markers(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
    ) -> None:
        prompt = multimodal(f"Look: {DEFAULT_MEDIA_MARKER} and {DEFAULT_MEDIA_MARKER}.", RED, BLUE)
        response = await vision_app.test_client().post("/completion", json={"prompt": prompt, "n_predict": 4})
        assert response.status_code == 200, await response.get_data()
        request = vision_engine.requests[-1]
        read_in_order(vision, request, 2)
        assert request.prompt_tokens[0] == tokenizer.bos_id or not tokenizer.add_bos
        assert texts_around_images(tokenizer, request)[1:] == [" and ", "."]
        assert (await response.get_json())["prompt"].count(DEFAULT_MEDIA_MARKER) == 2

    async def test_an_object_among_several_prompts(
        self, vision_app, vision: FakeVision, vision_engine: FakeEngine
    ) -> None:
        prompts = ["plain text", multimodal(f"{DEFAULT_MEDIA_MARKER} what?", RED)]
        response = await vision_app.test_client().post(
            "/completion", json={"prompt": prompts, "n_predict": 2}
        )
        assert response.status_code == 200, await response.get_data()
        assert len(await response.get_json()) == 2
        with_image = [r for r in vision_engine.requests[-2:] if r.images]
        assert len(with_image) == 1
        read_in_order(vision, with_image[0], 1)

    @pytest.mark.parametrize(
        ("prompt", "param"),
        [
            (multimodal("no marker", RED), "prompt.multimodal_data"),
            (multimodal(f"{DEFAULT_MEDIA_MARKER}{DEFAULT_MEDIA_MARKER}", RED), "prompt.multimodal_data"),
            ({"prompt_string": [1, 2], "multimodal_data": [b64(RED)]}, "prompt.prompt_string"),
            (multimodal(DEFAULT_MEDIA_MARKER, NOT_BASE64), "prompt.multimodal_data[0]"),
            (["a", multimodal(DEFAULT_MEDIA_MARKER, CORRUPT_PNG)], "prompt[1].multimodal_data[0]"),
        ],
    )  # fmt: skip
    async def test_a_bad_prompt_is_a_400_naming_it(self, vision_app, prompt: Any, param: str) -> None:
        error = await error_of(vision_app, "/completion", {"prompt": prompt, "n_predict": 2})
        assert error["param"] == param

    async def test_apply_template_shows_the_marker_and_reads_nothing(
        self, vision_app, vision: FakeVision
    ) -> None:
        """The prompt text with llama.cpp's marker where the image goes: no image read, no 500."""
        content = [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": data_uri(RED)}},
        ]
        body = {"messages": [{"role": "user", "content": content}]}
        response = await vision_app.test_client().post("/apply-template", json=body)
        assert response.status_code == 200, await response.get_data()
        prompt = (await response.get_json())["prompt"]
        assert f"What is it?\n{DEFAULT_MEDIA_MARKER}" in prompt
        assert re.search(r"<__media_[0-9a-f]+__>", prompt) is None  # not the request's own marker
        assert vision.read == []


# ---- capabilities ---------------------------------------------------------------------------


class TestCapabilities:
    async def test_models_and_props_follow_the_projector(self, app, vision_app) -> None:
        seen = []
        for one in (app, vision_app):
            client = one.test_client()
            models = await (await client.get("/v1/models")).get_json()
            props = await (await client.get("/props")).get_json()
            seen.append(
                (
                    models["data"][0]["architecture"]["input_modalities"],
                    models["models"][0]["capabilities"],
                    props["modalities"],
                )
            )
        assert seen == [
            (["text"], ["completion"], {"vision": False, "audio": False}),
            (["text", "image"], ["completion", "multimodal"], {"vision": True, "audio": False}),
        ]


async def test_debug_prompt_shows_the_marker(
    settings, make_runtime, vision_engine: FakeEngine, vision: FakeVision
) -> None:
    """/debug/prompt renders an image as the marker (tokenized as text) without reading it."""
    hooked = attrs.evolve(settings, server=attrs.evolve(settings.server, debug_hooks=True))
    runtime = attrs.evolve(make_runtime(), engine=vision_engine)
    app = create_app(hooked, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    content = [{"type": "image_url", "image_url": {"url": data_uri(RED)}}, {"type": "text", "text": "What?"}]
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        response = await test_app.test_client().post(
            "/debug/prompt",
            json={"messages": [{"role": "user", "content": content}]},
            scope_base={"server": ("127.0.0.1", 8080)},
        )
    assert response.status_code == 200, await response.get_data()
    body = await response.get_json()
    assert f"{DEFAULT_MEDIA_MARKER}\nWhat?" in body["prompt"]
    assert all(t >= 0 for t in body["tokens"])
    assert vision.read == []


async def test_input_tokens_counts_the_images_tokens(vision_app, vision: FakeVision) -> None:
    """llama-server's count of a chat request is the generation's prompt_tokens, images included."""
    content = [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": data_uri(RED)}},
    ]
    body = {"model": "bubo", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    client = vision_app.test_client()
    counted = await client.post("/v1/chat/completions/input_tokens", json=body)
    assert counted.status_code == 200, await counted.get_data()
    chat = await (await client.post("/v1/chat/completions", json=body)).get_json()
    assert (await counted.get_json())["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert len(vision.read) == 2


async def test_a_typed_marker_is_text_and_never_an_image(
    vision_app, vision: FakeVision, vision_engine: FakeEngine, tokenizer
) -> None:
    """llama.cpp's marker typed in a message stays text: only the request's own images are read."""
    typed = f"Is {DEFAULT_MEDIA_MARKER} an image? <__media_0000000000000000__>"
    body = {
        "model": "bubo",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": typed}, {"type": "image_url", "image_url": {"url": data_uri(RED)}}]}],
    }  # fmt: skip
    response = await vision_app.test_client().post("/v1/chat/completions", json=body)
    assert response.status_code == 200, await response.get_data()
    request = vision_engine.requests[-1]
    read_in_order(vision, request, 1)
    before, _after = texts_around_images(tokenizer, request)
    assert before.endswith(typed + "\n")


async def test_more_images_than_allowed_are_refused_before_any_is_read(
    vision_app, vision: FakeVision
) -> None:
    """--image-max-count: the first image past it is named, and none is decoded."""
    vision.max_images = 2
    parts = [{"type": "image_url", "image_url": {"url": data_uri(color)}} for color in (RED, BLUE, RED)]
    body = {"model": "bubo", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Compare"}, *parts]}]}  # fmt: skip
    error = await error_of(vision_app, "/v1/chat/completions", body)
    assert error["param"] == "messages[0].content[3].image_url.url"
    assert "--image-max-count" in error["message"]
    assert vision.read == []
