"""The server's chat defaults (--alias, --no-prefill-assistant, --reasoning, --reasoning-format) over the fake engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest

from bubo.app import create_app
from bubo.domain.requests import ChatDefaults
from bubo.engine.fake import FakeEngine
from bubo.templates import ChatTemplate

from ..conftest import QWEN3_STYLE, wait_until_ready

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "llama_cpp_templates"

COUNTING = [
    {"role": "user", "content": "Count to ten."},
    {"role": "assistant", "content": "1, 2, 3,"},
]
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(name="serve")
def _serve(settings, make_runtime):
    """``async with serve(**changes) as app``: the app over a runtime with *changes*."""

    @asynccontextmanager
    async def serve(**changes: object) -> AsyncIterator[object]:
        runtime = attrs.evolve(make_runtime(), **changes)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            yield test_app

    return serve


def qwen3() -> ChatTemplate:
    return ChatTemplate(QWEN3_STYLE.read_text(), bos_token="", eos_token="<|im_end|>", origin="test")


class TestAliases:
    async def test_every_alias_is_accepted_and_listed(self, serve) -> None:
        async with serve(model_id="first", aliases=("second", "third")) as app:
            client = app.test_client()
            for name in ("first", "second", "third", "bubo"):
                response = await client.post("/v1/chat/completions", json={"model": name, "messages": USER})
                assert response.status_code == 200, name
            missing = await client.post("/v1/chat/completions", json={"model": "fourth", "messages": USER})
            assert missing.status_code == 404
            listed = [m["id"] for m in (await (await client.get("/v1/models")).get_json())["data"]]
            assert listed == ["first", "second", "third", "bubo"]


class TestPrefillAssistant:
    async def test_by_default_the_final_assistant_message_is_continued(
        self, serve, fake_engine: FakeEngine, tokenizer
    ) -> None:
        async with serve() as app:
            await app.test_client().post("/v1/chat/completions", json={"model": "bubo", "messages": COUNTING})
        assert tokenizer.decode(fake_engine.requests[-1].prompt_tokens).endswith("assistant\n1, 2, 3,")

    async def test_without_prefill_it_is_a_whole_turn(
        self, serve, fake_engine: FakeEngine, tokenizer
    ) -> None:
        async with serve(chat=ChatDefaults(prefill_assistant=False)) as app:
            await app.test_client().post("/v1/chat/completions", json={"model": "bubo", "messages": COUNTING})
        assert tokenizer.decode(fake_engine.requests[-1].prompt_tokens).endswith(
            "assistant\n1, 2, 3,<|im_end|>\n<|im_start|>assistant\n"
        )

    async def test_a_request_still_decides(self, serve, fake_engine: FakeEngine, tokenizer) -> None:
        async with serve(chat=ChatDefaults(prefill_assistant=False)) as app:
            await app.test_client().post(
                "/v1/chat/completions",
                json={"model": "bubo", "messages": COUNTING, "continue_final_message": True},
            )
        assert tokenizer.decode(fake_engine.requests[-1].prompt_tokens).endswith("assistant\n1, 2, 3,")


class TestReasoning:
    async def rendered(self, app, **fields: object) -> str:
        response = await app.test_client().post("/apply-template", json={"messages": USER, **fields})
        return (await response.get_json())["prompt"]

    async def test_off_closes_the_thinking_unless_the_request_asks(self, serve) -> None:
        async with serve(template=qwen3(), chat=ChatDefaults(thinking=False)) as app:
            assert (await self.rendered(app)).endswith("<think>\n\n</think>\n\n")
            asked = await self.rendered(app, chat_template_kwargs={"enable_thinking": True})
            assert not asked.endswith("</think>\n\n")

    async def test_off_closes_a_block_the_template_always_opens(self, serve, fake_engine: FakeEngine) -> None:
        """The DeepSeek-R1 distills open `<think>` unconditionally: off closes it, and the answer is content."""
        source = (FIXTURES / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja").read_text()
        template = ChatTemplate(source, bos_token="", eos_token="<｜end▁of▁sentence｜>", origin="test")
        fake_engine.script.reply = "The answer."
        async with serve(template=template, chat=ChatDefaults(thinking=False)) as app:
            assert (await self.rendered(app)).endswith("<think>\n</think>")
            response = await app.test_client().post(
                "/v1/chat/completions", json={"model": "bubo", "messages": USER}
            )
            message = (await response.get_json())["choices"][0]["message"]
        assert message["content"] == "The answer."
        assert "reasoning_content" not in message

    async def test_auto_keeps_the_template_default(self, serve) -> None:
        async with serve(template=qwen3()) as app:
            assert not (await self.rendered(app)).endswith("</think>\n\n")

    @pytest.mark.parametrize(
        ("reasoning_format", "content", "reasoning"),
        [
            ("deepseek", "The answer.", "Let me see."),  # the space after the thinking is trimmed
            ("none", "<think>Let me see.</think> The answer.", None),
            ("deepseek-legacy", "<think>Let me see.</think> The answer.", "Let me see."),
        ],
    )
    async def test_formats(
        self, serve, fake_engine: FakeEngine, reasoning_format, content, reasoning
    ) -> None:
        fake_engine.script.reply = "<think>Let me see.</think> The answer."
        async with serve(template=qwen3(), chat=ChatDefaults(reasoning_format=reasoning_format)) as app:
            response = await app.test_client().post(
                "/v1/chat/completions", json={"model": "bubo", "messages": USER}
            )
        message = (await response.get_json())["choices"][0]["message"]
        assert message["content"] == content
        assert message.get("reasoning_content") == reasoning
