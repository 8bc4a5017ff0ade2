"""Hostile input on every route: a 400 in the route's envelope naming the bad field, never a 500.

Each case below answered 500, or was accepted and misread, before (issue 10):
lone surrogates (valid JSON escapes that are not Unicode) anywhere in a body;
numbers JSON can spell but nothing can mean (``1e309`` parses as infinity,
integers beyond 64 bits, token limits beyond llama.cpp's 32 bits, sampler
settings out of range); and tool-call arguments nested 100,000 deep.

Anthropic's envelope has no ``param``: there the message names the field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from dirty_equals import IsStr

from bubo.engine.fake import FakeEngine

LONE = "\ud800"  # a high surrogate with no low one after it
USER = {"role": "user", "content": "hi"}
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"

# the smallest valid body of each route
VALID: dict[str, dict[str, Any]] = {
    CHAT: {"model": "bubo", "messages": [USER]},
    COMPLETIONS: {"model": "bubo", "prompt": "hi"},
    RESPONSES: {"model": "bubo", "input": "hi"},
    MESSAGES: {"model": "bubo", "max_tokens": 4, "messages": [USER]},
    COUNT: {"model": "bubo", "messages": [USER]},
    "/completion": {"prompt": "hi"},
    "/apply-template": {"messages": [USER]},
    "/tokenize": {"content": "hi"},
}
NUMBER = "@number@"  # stands for a number literal json.dumps cannot write (see encode)


def body(path: str, **fields: Any) -> dict[str, Any]:
    return {**VALID[path], **fields}


def encode(data: dict[str, Any], number: str = "") -> bytes:
    """JSON with ASCII escapes (a lone surrogate stays ``\\ud800``) and *number* written for NUMBER."""
    return json.dumps(data).replace(json.dumps(NUMBER), number).encode()


async def post(app, path: str, data: bytes) -> tuple[int, Any]:
    response = await app.test_client().post(path, data=data, headers={"Content-Type": "application/json"})
    return response.status_code, await response.get_json()


def assert_rejected(path: str, status: int, payload: Any, *, code: str, param: str | None) -> None:
    """A 400 in the route's envelope with *code*, naming *param*."""
    assert status == 400, payload
    if path in (MESSAGES, COUNT):
        assert payload == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": IsStr, "code": code},
            "request_id": IsStr,
        }
        assert param is None or param in payload["error"]["message"]
    else:
        assert payload == {
            "error": {"message": IsStr, "type": "invalid_request_error", "param": param, "code": code}
        }


def assistant_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class TestLoneSurrogates:
    @pytest.mark.parametrize(
        ("path", "data", "param"),
        [
            (CHAT, body(CHAT, messages=[{"role": "user", "content": f"a{LONE}b"}]), "messages[0].content"),
            (CHAT, body(CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": LONE}]}]),
             "messages[0].content[0].text"),
            (CHAT, body(CHAT, stop=["ok", LONE]), "stop[1]"),
            (CHAT, body(CHAT, tools=[{"type": "function", "function": {"name": LONE}}]), "tools[0].function.name"),
            (CHAT, body(CHAT, logit_bias={LONE: 1}), "logit_bias"),
            (CHAT, {LONE: 1, **VALID[CHAT]}, None),
            (COMPLETIONS, body(COMPLETIONS, prompt=LONE), "prompt"),
            ("/completion", body("/completion", prompt=["a", LONE]), "prompt[1]"),
            ("/completion", body("/completion", stop=[LONE]), "stop[0]"),
            ("/completion", body("/completion", logit_bias={LONE: 1}), "logit_bias"),
            ("/completion", body("/completion", logit_bias=[[LONE, 1]]), "logit_bias[0][0]"),
            ("/apply-template", body("/apply-template", messages=[{"role": "user", "content": LONE}]),
             "messages[0].content"),
            ("/tokenize", body("/tokenize", content=LONE), "content"),
            (RESPONSES, body(RESPONSES, input=LONE), "input"),
            (RESPONSES, body(RESPONSES, input=[{"type": "message", "role": "user", "content": LONE}]),
             "input[0].content"),
            (RESPONSES, body(RESPONSES, instructions=LONE), "instructions"),
            (RESPONSES, body(RESPONSES, metadata={"k": LONE}), "metadata.k"),
            (RESPONSES, body(RESPONSES, metadata={LONE: "v"}), "metadata"),
            (MESSAGES, body(MESSAGES, messages=[{"role": "user", "content": LONE}]), "messages[0].content"),
            (MESSAGES, body(MESSAGES, system=LONE), "system"),
            (COUNT, body(COUNT, messages=[{"role": "user", "content": LONE}]), "messages[0].content"),
        ],
    )  # fmt: skip
    async def test_rejected_naming_the_string(self, app, path: str, data: dict[str, Any], param: str) -> None:
        """A lone surrogate anywhere is a 400 parse_error naming the string (or the object whose key holds it)."""
        status, payload = await post(app, path, encode(data))
        assert_rejected(path, status, payload, code="parse_error", param=param)

    async def test_surrogate_bytes_in_utf8(self, app) -> None:
        """A surrogate encoded straight into the UTF-8 bytes (not an escape) is refused the same way."""
        data = b'{"model": "bubo", "messages": [{"role": "user", "content": "a\xed\xa0\x80"}]}'
        status, payload = await post(app, CHAT, data)
        assert_rejected(CHAT, status, payload, code="parse_error", param="messages[0].content")

    async def test_a_surrogate_pair_is_one_character(self, app, fake_engine: FakeEngine, tokenizer) -> None:
        """A pair of escapes (how ASCII-only clients send an emoji) is valid and reaches the prompt."""
        data = encode(body(COMPLETIONS, prompt="smile \U0001f600"))
        assert b"\\ud83d\\ude00" in data
        status, _ = await post(app, COMPLETIONS, data)
        assert status == 200
        assert list(fake_engine.requests[-1].prompt_tokens) == list(tokenizer.encode("smile \U0001f600"))


class TestNumbers:
    @pytest.mark.parametrize(
        ("path", "data", "number", "param"),
        [
            (CHAT, body(CHAT, temperature=NUMBER), "1e309", "temperature"),
            (CHAT, body(CHAT, top_p=NUMBER), "-1e309", "top_p"),
            (CHAT, body(CHAT, presence_penalty=NUMBER), "1e309", "presence_penalty"),
            (CHAT, body(CHAT, frequency_penalty=NUMBER), "-1E+400", "frequency_penalty"),
            (CHAT, body(CHAT, repeat_penalty=NUMBER), "1" + "0" * 400 + ".0", "repeat_penalty"),
            (CHAT, body(CHAT, logit_bias={"15": NUMBER}), "1e309", "logit_bias.15"),
            (CHAT, body(CHAT, tools=[{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"n": {"type": "number", "maximum": NUMBER}}}}}]),
             "1e309", "tools[0].function.parameters.properties.n.maximum"),
            (COMPLETIONS, body(COMPLETIONS, temperature=NUMBER), "1e309", "temperature"),
            ("/completion", body("/completion", min_p=NUMBER), "1e309", "min_p"),
            ("/completion", body("/completion", logit_bias=[[15, NUMBER]]), "-1e309", "logit_bias[0][1]"),
            (RESPONSES, body(RESPONSES, temperature=NUMBER), "1e309", "temperature"),
            (MESSAGES, body(MESSAGES, temperature=NUMBER), "1e309", "temperature"),
        ],
    )  # fmt: skip
    async def test_infinite_numbers(
        self, app, path: str, data: dict[str, Any], number: str, param: str
    ) -> None:
        """A number too large for a double (JSON has no infinity) is a 400 parse_error naming it."""
        status, payload = await post(app, path, encode(data, number))
        assert_rejected(path, status, payload, code="parse_error", param=param)

    @pytest.mark.parametrize(
        ("path", "data", "param"),
        [
            (CHAT, body(CHAT, max_tokens=2**70), "max_tokens"),
            (CHAT, body(CHAT, seed=2**64), "seed"),
            (CHAT, body(CHAT, top_k=-(2**63) - 1), "top_k"),
            (COMPLETIONS, body(COMPLETIONS, max_tokens=2**70), "max_tokens"),
            ("/completion", body("/completion", n_predict=2**70), "n_predict"),
            ("/completion", body("/completion", t_max_predict_ms=2**64), "t_max_predict_ms"),
            ("/completion", body("/completion", prompt=[2**64]), "prompt[0]"),
            (RESPONSES, body(RESPONSES, max_output_tokens=2**70), "max_output_tokens"),
            (MESSAGES, body(MESSAGES, max_tokens=2**70), "max_tokens"),
            (MESSAGES, body(MESSAGES, max_tokens=4.0e30), "max_tokens"),
        ],
    )  # fmt: skip
    async def test_integers_beyond_64_bits(self, app, path: str, data: dict[str, Any], param: str) -> None:
        """An integer field never takes more than 64 bits: a 400 parse_error naming it."""
        status, payload = await post(app, path, encode(data))
        assert_rejected(path, status, payload, code="parse_error", param=param)

    @pytest.mark.parametrize(
        ("path", "data", "param"),
        [
            (CHAT, body(CHAT, max_tokens=2**31), "max_tokens"),
            (CHAT, body(CHAT, max_completion_tokens=2**40), "max_completion_tokens"),
            (COMPLETIONS, body(COMPLETIONS, max_tokens=2**31), "max_tokens"),
            ("/completion", body("/completion", n_predict=2**31), "n_predict"),
            ("/completion", body("/completion", max_tokens=2**31), "max_tokens"),
            (RESPONSES, body(RESPONSES, max_output_tokens=2**31), "max_output_tokens"),
            (MESSAGES, body(MESSAGES, max_tokens=2**31), "max_tokens"),
            (CHAT, body(CHAT, top_k=2**31), "top_k"),
            (MESSAGES, body(MESSAGES, top_k=2**31), "top_k"),
            ("/completion", body("/completion", top_k=-(2**31) - 1), "top_k"),
            ("/completion", body("/completion", repeat_last_n=-2), "repeat_last_n"),
            ("/completion", body("/completion", repeat_last_n=2**31), "repeat_last_n"),
            (CHAT, body(CHAT, top_p=1.5), "top_p"),
            (RESPONSES, body(RESPONSES, top_p=-0.1), "top_p"),
            (MESSAGES, body(MESSAGES, top_p=2), "top_p"),
            (COMPLETIONS, body(COMPLETIONS, min_p=1.01), "min_p"),
            (CHAT, body(CHAT, temperature=1e39), "temperature"),
            (MESSAGES, body(MESSAGES, temperature=-1e39), "temperature"),
            (CHAT, body(CHAT, presence_penalty=1e39), "presence_penalty"),
            ("/completion", body("/completion", frequency_penalty=-1e300), "frequency_penalty"),
            ("/completion", body("/completion", repeat_penalty=1e300), "repeat_penalty"),
            (CHAT, body(CHAT, repeat_penalty=0), "repeat_penalty"),
            ("/completion", body("/completion", repeat_penalty=-1), "repeat_penalty"),
            (CHAT, body(CHAT, logit_bias={"15": 1e39}), "logit_bias.15"),
            ("/completion", body("/completion", logit_bias=[[15, -1e39]]), "logit_bias[0][1]"),
            ("/completion", body("/completion", logit_bias={"hello": 1e39}), "logit_bias.hello"),
        ],
    )  # fmt: skip
    async def test_out_of_range(self, app, path: str, data: dict[str, Any], param: str) -> None:
        """Token limits fit llama.cpp's 32 bits, probabilities 0..1, sampler floats its 32-bit float."""
        status, payload = await post(app, path, encode(data))
        assert_rejected(path, status, payload, code="invalid_request", param=param)

    async def test_the_bounds_themselves_are_accepted(self, app, fake_engine: FakeEngine) -> None:
        """The largest token limit, top_k and finite 32-bit values all reach the engine."""
        data = body(
            "/completion",
            n_predict=2**31 - 1,
            top_k=2**31 - 1,
            top_p=1,
            min_p=0,
            repeat_last_n=-1,
            temperature=3.4e38,
            presence_penalty=-3.4e38,
            seed=2**63 - 1,
        )
        status, payload = await post(app, "/completion", encode(data))
        assert status == 200, payload
        request = fake_engine.requests[-1]
        assert request.max_new_tokens == 2**31 - 1
        assert (request.sampling.top_k, request.sampling.repeat_last_n) == (2**31 - 1, -1)


class TestLogitBiasKeys:
    @pytest.mark.parametrize("key", ["--5", "²", "٥", "5_0", "0x10", "", "1" * 19])
    async def test_openai_keys_are_ascii_token_ids(self, app, key: str) -> None:
        """OpenAI logit_bias keys are token ids in ASCII digits; anything else is a 400 naming the key."""
        status, payload = await post(app, CHAT, encode(body(CHAT, logit_bias={key: 1})))
        assert_rejected(CHAT, status, payload, code="invalid_request", param=f"logit_bias.{key}")

    async def test_llama_server_reads_odd_keys_as_texts(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """/completion reads a key as a token id the way llama-server's strtol does, else as a text to bias."""
        data = body("/completion", logit_bias={"--5": 2, "²": 3, " +7": 4, "-0": 5})
        status, payload = await post(app, "/completion", encode(data))
        assert status == 200, payload
        bias = dict(fake_engine.requests[-1].sampling.logit_bias)
        assert all(bias[token] == 2 for token in tokenizer.encode("--5"))
        assert all(bias[token] == 3 for token in tokenizer.encode("²"))
        assert (bias[7], bias[0]) == (4, 5)

    async def test_a_huge_numeric_key_is_no_token(self, app) -> None:
        """Digits too many for any vocabulary are a 400, not a text and not int()'s 4,300-digit error."""
        key = "9" * 5000
        status, payload = await post(app, "/completion", encode(body("/completion", logit_bias={key: 1})))
        assert_rejected("/completion", status, payload, code="invalid_request", param=f"logit_bias.{key}")


def nested_object(depth: int, **extra: Any) -> dict[str, Any]:
    """An object *depth* arrays and objects deep (itself included)."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"a": value, **extra}


class TestDeepArguments:
    DEEP = "[" * 100_000

    @pytest.mark.parametrize(
        ("path", "data", "param"),
        [
            (CHAT, body(CHAT, messages=[USER, assistant_call(DEEP)]), "messages[1].tool_calls[0].function.arguments"),
            ("/apply-template", body("/apply-template", messages=[USER, assistant_call(DEEP)]),
             "messages[1].tool_calls[0].function.arguments"),
            (RESPONSES, body(RESPONSES, input=[
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": DEEP},
            ]), "input[1].arguments"),
            (MESSAGES, body(MESSAGES, messages=[
                USER,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": nested_object(200)}]},
            ]), "messages[1].content[0].input"),
        ],
    )  # fmt: skip
    async def test_too_deep(self, app, path: str, data: dict[str, Any], param: str) -> None:
        """Arguments nested deeper than 64 arrays or objects are a 400 arguments_too_deep naming them."""
        status, payload = await post(app, path, encode(data))
        assert_rejected(path, status, payload, code="arguments_too_deep", param=param)

    @pytest.mark.parametrize("path", [CHAT, "/apply-template"])
    async def test_64_levels_are_rendered(self, app, path: str) -> None:
        """64 levels (the limit) are accepted, and brackets inside strings do not count."""
        arguments = json.dumps(nested_object(64, s="[" * 1000))
        status, payload = await post(
            app, path, encode(body(path, messages=[USER, assistant_call(arguments)]))
        )
        assert status == 200, payload

    async def test_64_levels_of_anthropic_input_are_rendered(self, app) -> None:
        """An Anthropic tool_use input 64 levels deep (the limit) is accepted."""
        turn = {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": nested_object(64)}],
        }
        status, payload = await post(app, MESSAGES, encode(body(MESSAGES, messages=[USER, turn])))
        assert status == 200, payload
