"""``--verbose``: llama-server's ``__verbose`` on the OpenAI answers, for requests on a loopback address.

It shows the prompt as rendered (an assistant prefill included, with no end of turn
after it) and the model's raw output, before the reasoning and tool-call parsers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import attrs
import pytest
from quart_trio import QuartTrio
from tests.conftest import QWEN3_STYLE, RuntimeFactory, wait_until_ready

from bubo.config import Settings
from bubo.engine.fake import FakeScript
from bubo.server import create_app
from bubo.templates import ChatTemplate

LOOPBACK = {"server": ("127.0.0.1", 8080)}
PREFILLED = [
    {"role": "system", "content": "Book"},
    {"role": "user", "content": "What is the best book"},
    {"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]},
]


async def _serving(
    settings: Settings, runtime_of: RuntimeFactory, *, verbose: bool
) -> AsyncIterator[QuartTrio]:
    chosen = attrs.evolve(settings, server=attrs.evolve(settings.server, verbose=verbose))
    app = create_app(chosen, load=lambda _s, _p: runtime_of(), on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app  # type: ignore[misc]


@pytest.fixture(name="verbose_app")
async def _verbose_app(settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    async for app in _serving(settings, make_runtime, verbose=True):
        yield app


def _frames(raw: bytes) -> list[dict]:
    lines = raw.decode().split("\n\n")
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def test_chat_shows_the_rendered_prompt_with_its_prefill(verbose_app, script: FakeScript) -> None:
    script.reply = "ow"
    response = await verbose_app.test_client().post(
        "/v1/chat/completions",
        json={"model": "bubo", "messages": PREFILLED, "max_tokens": 8},
        scope_base=LOOPBACK,
    )
    body = await response.get_json()
    verbose = body["__verbose"]
    assert verbose["prompt"].endswith("<|im_start|>assistant\nWhill")
    assert "<|im_start|>system\nBook<|im_end|>" in verbose["prompt"]
    assert verbose["content"] == "ow" == body["choices"][0]["message"]["content"]
    assert (verbose["tokens_evaluated"], verbose["tokens_predicted"]) == (
        body["usage"]["prompt_tokens"],
        body["usage"]["completion_tokens"],
    )


async def test_the_raw_output_is_the_text_before_the_parsers(
    settings: Settings, make_runtime: RuntimeFactory, script: FakeScript
) -> None:
    """With a thinking template the answer splits the reasoning out; ``__verbose.content`` keeps the tags."""
    template = ChatTemplate(QWEN3_STYLE.read_text(), bos_token="", eos_token="<|im_end|>", origin="test")
    script.reply = "<think>hmm</think>Paris"
    async for app in _serving(
        settings, lambda: attrs.evolve(make_runtime(), template=template), verbose=True
    ):
        response = await app.test_client().post(
            "/v1/chat/completions",
            json={"model": "bubo", "messages": [{"role": "user", "content": "Capital?"}], "max_tokens": 32},
            scope_base=LOOPBACK,
        )
        body = await response.get_json()
    assert body["choices"][0]["message"]["content"] == "Paris"
    assert body["__verbose"]["content"] == "<think>hmm</think>Paris"


async def test_streams_carry_it_on_the_finish_chunk(verbose_app, script: FakeScript) -> None:
    script.reply = "ow"
    chat = await verbose_app.test_client().post(
        "/v1/chat/completions",
        json={"model": "bubo", "messages": PREFILLED, "max_tokens": 8, "stream": True},
        scope_base=LOOPBACK,
    )
    frames = _frames(await chat.get_data())
    carrying = [f for f in frames if "__verbose" in f]
    assert len(carrying) == 1
    assert carrying[0]["choices"][0]["finish_reason"] is not None
    assert carrying[0]["__verbose"]["content"] == "ow"
    legacy = await verbose_app.test_client().post(
        "/v1/completions",
        json={"model": "bubo", "prompt": "Once upon", "max_tokens": 8, "stream": True},
        scope_base=LOOPBACK,
    )
    frames = _frames(await legacy.get_data())
    assert [f["__verbose"]["prompt"] for f in frames if "__verbose" in f] == ["Once upon"]


async def test_completions_show_the_prompt_and_output(verbose_app, script: FakeScript) -> None:
    script.reply = " a time"
    response = await verbose_app.test_client().post(
        "/v1/completions", json={"model": "bubo", "prompt": "Once upon", "max_tokens": 8}, scope_base=LOOPBACK
    )
    body = await response.get_json()
    assert body["__verbose"]["prompt"] == "Once upon"
    assert body["__verbose"]["content"] == " a time"


async def test_not_on_an_address_other_than_loopback(verbose_app) -> None:
    """A server reached on another address (Hypercorn bound to 0.0.0.0, say) leaves it out."""
    response = await verbose_app.test_client().post(
        "/v1/chat/completions",
        json={"model": "bubo", "messages": PREFILLED, "max_tokens": 8},
        scope_base={"server": ("192.0.2.7", 8080)},
    )
    assert response.status_code == 200
    assert "__verbose" not in await response.get_json()


async def test_off_by_default(app) -> None:
    response = await app.test_client().post(
        "/v1/chat/completions",
        json={"model": "bubo", "messages": PREFILLED, "max_tokens": 8},
        scope_base=LOOPBACK,
    )
    assert "__verbose" not in await response.get_json()
