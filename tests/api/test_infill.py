"""POST /infill over the fake engine: llama-server's FIM layout, its token budget, and its errors."""

from __future__ import annotations

import json

import attrs
import pytest
from tests.conftest import wait_until_ready

from bubo.engine import FimTokens
from bubo.engine.fake import FakeEngine, FakeScript, fake_model_info
from bubo.server import create_app

FIM = FimTokens(pre=10, suf=11, mid=12, rep=13, sep=14)


@pytest.fixture(name="fim_engine")
def _fim_engine(script: FakeScript) -> FakeEngine:
    """A fake engine whose model has FIM tokens (ids of the real vocabulary, used as markers)."""
    return FakeEngine(info=attrs.evolve(fake_model_info(), fim=FIM, n_batch=64), script=script)


@pytest.fixture(name="fim_app")
async def _fim_app(settings, make_runtime, fim_engine, request):
    spm = getattr(request, "param", False)
    runtime = attrs.evolve(make_runtime(), engine=fim_engine, spm_infill=spm)
    app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, parse_special=False)


class TestLayout:
    async def test_repo_level_fim_prompt(self, fim_app, fim_engine, tokenizer, script) -> None:
        """Extra files, then the gap's file: [REP]myproject [SEP]name text … [SEP]filename [PRE]…[SUF]…[MID]."""
        script.reply = "a + b"
        response = await fim_app.test_client().post(
            "/infill",
            json={
                "input_prefix": "def add(a, b):\n    return ",
                "input_suffix": "\n\nprint(add(1, 2))",
                "input_extra": [{"filename": "util.py", "text": "X = 1\n"}, {"text": "Y = 2\n"}],
                "prompt": "(",
                "n_predict": 8,
            },
        )
        assert response.status_code == 200
        body = await response.get_json()
        assert body["content"] == "a + b"
        assert body["stop"] is True
        assert body["generation_settings"]["n_predict"] == 8
        assert fim_engine.requests[-1].prompt_tokens == (
            FIM.rep, *encode(tokenizer, "myproject\n"),
            FIM.sep, *encode(tokenizer, "util.py\n"), *encode(tokenizer, "X = 1\n"),
            FIM.sep, *encode(tokenizer, "tmp\n"), *encode(tokenizer, "Y = 2\n"),
            FIM.sep, *encode(tokenizer, "filename\n"),
            FIM.pre, *encode(tokenizer, "def add(a, b):\n    return "), *encode(tokenizer, "("),
            FIM.suf, *encode(tokenizer, "\n\nprint(add(1, 2))"),
            FIM.mid,
        )  # fmt: skip

    @pytest.mark.parametrize("fim_app", [True], indirect=True)
    async def test_spm_order(self, fim_app, fim_engine, tokenizer) -> None:
        """--spm-infill: the suffix part comes before the prefix part."""
        response = await fim_app.test_client().post(
            "/infill", json={"input_prefix": "x = ", "input_suffix": "\ny = 2"}
        )
        assert response.status_code == 200
        assert fim_engine.requests[-1].prompt_tokens == (
            FIM.rep, *encode(tokenizer, "myproject\n"), FIM.sep, *encode(tokenizer, "filename\n"),
            FIM.suf, *encode(tokenizer, "\ny = 2"), FIM.pre, *encode(tokenizer, "x = "), FIM.mid,
        )  # fmt: skip

    async def test_without_repo_and_separator_tokens(self, settings, make_runtime, tokenizer, script) -> None:
        """A vocabulary with only PRE/SUF/MID separates extra chunks with a snippet line."""
        engine = FakeEngine(
            info=attrs.evolve(fake_model_info(), fim=FimTokens(pre=10, suf=11, mid=12), n_batch=64),
            script=script,
        )
        runtime = attrs.evolve(make_runtime(), engine=engine)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as client_app:
            await wait_until_ready(app)
            response = await client_app.test_client().post(
                "/infill", json={"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "c"}]}
            )
        assert response.status_code == 200
        assert engine.requests[-1].prompt_tokens == (
            *encode(tokenizer, "\n\n--- snippet ---\n\n"), *encode(tokenizer, "c"),
            10, *encode(tokenizer, "a"), 11, *encode(tokenizer, "b"), 12,
        )  # fmt: skip

    async def test_budget_keeps_the_text_nearest_the_gap(self, fim_app, fim_engine, tokenizer) -> None:
        """The prefix keeps its last 3/4 n_batch tokens, the suffix its first n_batch/4 - 2 - len(prompt).

        n_batch is 64: 48 prefix tokens, 16 - 2 - 1 = 13 suffix tokens.
        """
        prefix = encode(tokenizer, " a" * 100)
        suffix = encode(tokenizer, " b" * 100)
        assert len(prefix) == len(suffix) == 100
        response = await fim_app.test_client().post(
            "/infill", json={"input_prefix": " a" * 100, "input_suffix": " b" * 100, "prompt": " c"}
        )
        assert response.status_code == 200
        tokens = fim_engine.requests[-1].prompt_tokens
        start = tokens.index(FIM.pre)
        assert tokens[start:] == (
            FIM.pre, *prefix[-48:], *encode(tokenizer, " c"), FIM.suf, *suffix[:13], FIM.mid,
        )  # fmt: skip

    async def test_extra_context_leaves_room_to_generate(self, fim_app, fim_engine, tokenizer) -> None:
        """Extra context keeps its last n_ctx - n_batch - 2 n_predict tokens (2048 - 64 - 2 * 900 = 184)."""
        chunk = " z" * 500
        response = await fim_app.test_client().post(
            "/infill",
            json={"input_prefix": "", "input_suffix": "", "input_extra": [{"text": chunk}], "n_predict": 900},
        )
        assert response.status_code == 200
        tokens = fim_engine.requests[-1].prompt_tokens
        extra = [*encode(tokenizer, chunk), FIM.sep, *encode(tokenizer, "filename\n")]
        assert tokens == (*extra[-184:], FIM.pre, FIM.suf, FIM.mid)

    async def test_stream(self, fim_app, script) -> None:
        """stream: /completion's chunks, then the final result."""
        script.reply = "one two"
        response = await fim_app.test_client().post(
            "/infill", json={"input_prefix": "a", "input_suffix": "b", "stream": True}
        )
        assert response.status_code == 200
        frames = [
            json.loads(line[len("data: ") :])
            for line in (await response.get_data(as_text=True)).splitlines()
            if line.startswith("data: ")
        ]
        assert "".join(frame["content"] for frame in frames) == "one two"
        assert frames[-1]["stop"] is True


class TestErrors:
    async def test_model_without_fim_tokens(self, app) -> None:
        """The default model's vocabulary has no FIM tokens: 501 not_implemented that says so, as llama-server."""
        response = await app.test_client().post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
        assert response.status_code == 501
        error = (await response.get_json())["error"]
        assert error["code"] == "not_implemented"
        assert "fill-in-the-middle" in error["message"]

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"input_suffix": "b"}, "input_prefix"),
            ({"input_prefix": "a"}, "input_suffix"),
            ({"input_prefix": 1, "input_suffix": "b"}, "input_prefix"),
            ({"input_prefix": "a", "input_suffix": "b", "prompt": [1, 2]}, "prompt"),
            ({"input_prefix": "a", "input_suffix": "b", "input_extra": "c"}, "input_extra"),
            ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}, "input_extra[0].text"),
            ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "filename": 3}]},
             "input_extra[0].filename"),
            ({"input_prefix": "a", "input_suffix": "b", "n_predict": -2}, "n_predict"),
            ({"input_prefix": "a", "input_suffix": "b", "id_slot": 7}, "id_slot"),
        ],
    )  # fmt: skip
    async def test_bad_fields(self, fim_app, body, param) -> None:
        """Each bad field is a 400 naming it."""
        response = await fim_app.test_client().post("/infill", json=body)
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param

    async def test_too_long_for_the_context(self, settings, make_runtime, script) -> None:
        """With a batch larger than the context, the FIM prompt may not fit: context_length_exceeded."""
        engine = FakeEngine(
            info=attrs.evolve(fake_model_info(n_ctx=64), fim=FIM, n_batch=2048), script=script
        )
        runtime = attrs.evolve(make_runtime(), engine=engine)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as client_app:
            await wait_until_ready(app)
            response = await client_app.test_client().post(
                "/infill", json={"input_prefix": " a" * 200, "input_suffix": ""}
            )
        assert response.status_code == 400
        assert (await response.get_json())["error"]["code"] == "context_length_exceeded"
