"""A conversation that ends with an assistant message is continued in every dialect (llama-server's prefill).

The prompt the engine receives ends with the assistant's text, with no end of
turn after it; the answer holds only what the model writes on from there.
"""

from __future__ import annotations

import pytest

from bubo.engine.fake import FakeEngine

# the default model's template opens with its own system prompt; what matters is how it ends
OPEN = "<|im_start|>user\nCount to ten.<|im_end|>\n<|im_start|>assistant\n"
COUNTING = [
    {"role": "user", "content": "Count to ten."},
    {"role": "assistant", "content": "1, 2, 3,"},
]


def engine_prompt(fake_engine: FakeEngine, tokenizer) -> str:
    return tokenizer.decode(fake_engine.requests[-1].prompt_tokens)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "bubo", "messages": COUNTING, "max_tokens": 4}),
        ("/v1/messages", {"model": "bubo", "messages": COUNTING, "max_tokens": 4}),
        ("/v1/responses", {"model": "bubo", "input": COUNTING, "max_output_tokens": 4}),
    ],
    ids=["chat", "anthropic", "responses"],
)
async def test_every_dialect_continues_the_final_assistant_message(
    app, fake_engine: FakeEngine, tokenizer, path: str, body: dict[str, object]
) -> None:
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 200, await response.get_data()
    assert engine_prompt(fake_engine, tokenizer).endswith(OPEN + "1, 2, 3,")


async def test_the_answer_holds_only_the_continuation(app, fake_engine: FakeEngine) -> None:
    fake_engine.script.reply = " 4, 5, 6"
    response = await app.test_client().post(
        "/v1/chat/completions", json={"model": "bubo", "messages": COUNTING}
    )
    assert (await response.get_json())["choices"][0]["message"]["content"] == " 4, 5, 6"


class TestApplyTemplate:
    async def render(self, app, **fields: object) -> tuple[int, dict[str, object]]:
        response = await app.test_client().post("/apply-template", json={"messages": COUNTING, **fields})
        return response.status_code, await response.get_json()

    async def test_continues_by_default(self, app) -> None:
        status, body = await self.render(app)
        assert (status, body["prompt"][-len(OPEN) - 8 :]) == (200, OPEN + "1, 2, 3,")

    async def test_continue_final_message_false_closes_the_turn(self, app) -> None:
        status, body = await self.render(app, continue_final_message=False)
        assert status == 200
        assert body["prompt"].endswith(OPEN + "1, 2, 3,<|im_end|>\n<|im_start|>assistant\n")

    async def test_add_generation_prompt_false_renders_the_messages_as_they_are(self, app) -> None:
        status, body = await self.render(app, add_generation_prompt=False)
        assert status == 200
        assert body["prompt"].endswith(OPEN + "1, 2, 3,<|im_end|>\n")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template"])
async def test_both_switches_true_is_a_400(app, path: str) -> None:
    body = {
        "model": "bubo",
        "messages": COUNTING,
        "add_generation_prompt": True,
        "continue_final_message": True,
    }
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 400
    error = (await response.get_json())["error"]
    assert error["param"] == "continue_final_message"
    assert "cannot both be true" in error["message"]
