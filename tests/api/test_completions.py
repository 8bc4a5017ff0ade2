"""POST /v1/completions over the fake engine."""

from __future__ import annotations

import json

import pytest
from dirty_equals import IsStr

from bubo.engine.fake import FakeEngine, FakeScript

PATH = "/v1/completions"


class TestTextCompletions:
    async def test_response_shape(self, app, script: FakeScript) -> None:
        """A text completion has object text_completion and choices[].text."""
        script.reply = " Paris."
        response = await app.test_client().post(
            PATH, json={"model": "bubo", "prompt": "The capital of France is", "max_tokens": 8}
        )
        assert response.status_code == 200
        body = await response.get_json()
        assert body["object"] == "text_completion"
        assert body["id"] == IsStr(regex=r"cmpl-[0-9a-f]{32}")  # OpenAI's completions prefix
        assert body["choices"] == [{"index": 0, "text": " Paris.", "logprobs": None, "finish_reason": "stop"}]
        assert body["usage"]["completion_tokens"] == 1
        assert body["timings"]["predicted_n"] == 1

    async def test_prompt_is_raw_text(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """The prompt is tokenized as is, no chat template."""
        await app.test_client().post(PATH, json={"model": "bubo", "prompt": "Once upon"})
        assert fake_engine.requests[-1].prompt_tokens == tuple(tokenizer.encode("Once upon"))

    async def test_token_id_prompt(self, app, fake_engine: FakeEngine) -> None:
        """A prompt of token ids is used as is."""
        await app.test_client().post(PATH, json={"model": "bubo", "prompt": [504, 3458, 314]})
        assert fake_engine.requests[-1].prompt_tokens == (504, 3458, 314)

    async def test_legacy_logprobs(self, app, script: FakeScript) -> None:
        """logprobs: N returns tokens, token_logprobs, top_logprobs and text_offset."""
        script.reply = "a b"
        body = await (
            await app.test_client().post(PATH, json={"model": "bubo", "prompt": "x", "logprobs": 1})
        ).get_json()
        assert body["choices"][0]["logprobs"] == {
            "tokens": ["a", " b"],
            "token_logprobs": [-0.5, -0.5],
            "top_logprobs": [{"a": -0.5}, {" b": -0.5}],
            "text_offset": [0, 1],
        }

    async def test_streaming(self, app, script: FakeScript) -> None:
        """Streamed text_completion chunks; usage on the last one; then [DONE]."""
        script.reply = "one two"
        response = await app.test_client().post(PATH, json={"model": "bubo", "prompt": "x", "stream": True})
        events = [e.removeprefix("data: ") for e in (await response.get_data()).decode().split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks) == "one two"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["usage"]["completion_tokens"] == 2
        assert all("usage" not in c for c in chunks[:-1])

    @pytest.mark.parametrize(
        ("body", "code", "param"),
        [
            ({"model": "bubo"}, "missing_prompt", "prompt"),
            ({"model": "bubo", "prompt": ["a", "b"]}, "unsupported_n", "prompt"),
            ({"model": "bubo", "prompt": "x", "n": 3}, "unsupported_n", "n"),
            ({"model": "bubo", "prompt": "x", "echo": True}, "unsupported_echo", "echo"),
            ({"model": "bubo", "prompt": [99999999]}, "invalid_request", "prompt[0]"),
            ({"prompt": "x"}, "missing_model", "model"),
        ],
    )
    async def test_errors(self, app, body, code, param) -> None:
        """Bad completion requests are 400s naming the field."""
        response = await app.test_client().post(PATH, json=body)
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == (code, param)
