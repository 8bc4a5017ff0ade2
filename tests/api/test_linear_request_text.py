"""The regular expressions Bubo applies to request text take linear time (issue 36, docs/security.md).

Each is driven with an input of n and of 4n characters made of what could
make a regular expression backtrack (tests/_linear.py); hypothesis chooses
the piece repeated; translating a request's turns is driven the same way.  Ollama's ``keep_alive`` has its own in
tests/api/test_ollama_keep_alive.py, the parsers of model output theirs in
tests/parsers/test_linear_parsers.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bubo.api._converter import make_converter
from bubo.api._nesting import check_arguments_depth
from bubo.api._numbers import token_id
from bubo.api._values import NonFiniteNumbers, check_values
from bubo.api.responses import wire as responses
from bubo.api.responses.translate import responses_request
from bubo.domain.messages import ChatPrompt, Message
from bubo.errors import BuboError
from bubo.server import _SANE_REQUEST_ID
from bubo.service.prompt import stable_prompt
from bubo.service.validation import check_output
from bubo.tokenizer import HFTokenizer

from .._linear import assert_linear

N = 50_000
UNITS = st.sampled_from(['"', "\\", '\\"', "[", "{", '"[', " ", "\t", "+", "1", "a", "-", "\n",
                         "x-anthropic-billing-header:", "\\ud8", "\ud800"]) | st.text(min_size=1, max_size=4)  # fmt: skip
slow = settings(max_examples=4, deadline=None)


def repeated(prefix: str, unit: str, suffix: str = "") -> Callable[[int], str]:
    return lambda n: prefix + unit * (n // len(unit) + 1) + suffix


def refused_or_read(read: Callable[[str], object]) -> Callable[[str], None]:
    """*read*, its 400 counted as reading."""

    def run(text: str) -> None:
        with contextlib.suppress(BuboError):
            read(text)

    return run


@slow
@given(UNITS)
@example('"')  # a string that never closes: a pattern that must close it would read it from every quote
def test_tool_call_arguments_depth(unit: str) -> None:
    assert_linear(
        repeated("[", unit), refused_or_read(lambda text: check_arguments_depth(text, "arguments")), N
    )


@slow
@given(UNITS)
@example(" ")
def test_logit_bias_keys(unit: str) -> None:
    assert_linear(repeated("", unit, "x"), refused_or_read(lambda key: token_id(key, "logit_bias")), N)


@slow
@given(UNITS)
def test_request_ids(unit: str) -> None:
    """The X-Request-Id check: at most 128 characters are looked at, whatever the header's length."""
    assert_linear(repeated("", unit, "!"), _SANE_REQUEST_ID.fullmatch, N)


@slow
@given(UNITS.filter(lambda unit: unit.isascii()))
@example("\\ud8")
def test_the_surrogate_check_of_a_body(unit: str) -> None:
    def body(n: int) -> bytes:
        return json.dumps({"content": unit * (n // len(unit) + 1)}, ensure_ascii=False).encode(
            errors="replace"
        )

    def check(raw: bytes) -> None:
        with contextlib.suppress(BuboError, ValueError):
            check_values(json.loads(raw), raw, NonFiniteNumbers())

    assert_linear(body, check, N)


@slow
@given(UNITS)
@example("x-anthropic-billing-header: a\n")
def test_the_billing_line_of_a_system_prompt(unit: str) -> None:
    def prompt(n: int) -> ChatPrompt:
        text = "x-anthropic-billing-header:" + unit * (n // len(unit) + 1)
        return ChatPrompt(messages=(Message(role="system", content=text), Message(role="user", content="hi")))

    assert_linear(prompt, stable_prompt, N)


@slow
@given(UNITS)
@example("Decimal('")
def test_the_output_checks_message(unit: str) -> None:
    """A structured output that fails its schema is shown in the error, Decimal reprs unwrapped."""

    def check(text: str) -> None:
        with contextlib.suppress(BuboError):
            check_output(text, {"type": "integer"}, "response_format")

    assert_linear(lambda n: json.dumps(unit * (n // len(unit) + 1)), check, N)


@slow
@given(st.sampled_from(["a", " ", "a ", ".", "\n", "a.", "\na", " \n"]))
def test_a_long_prompt_cut_for_parallel_tokenizing(tokenizer: HFTokenizer, unit: str) -> None:
    """Pre-token boundaries are searched for from the last piece's end, never from the start again."""
    assert_linear(repeated("", unit), lambda text: list(tokenizer._pieces_of(text)), 4 * N)


@pytest.mark.parametrize(
    "item",
    [responses.FunctionCallItem(type="function_call", call_id="c", name="f", arguments="{}"),
     responses.MessageItem(role="assistant", content="Some text."),
     responses.ReasoningItem(type="reasoning", content=[responses.ReasoningPart(type="reasoning_text", text="Hm.")])],
)  # fmt: skip
def test_a_run_of_assistant_items_in_a_responses_request(item: responses.InputItem) -> None:
    """Thousands of calls in a row fold into one assistant turn built once (each merged in copied it: n²)."""
    converter = make_converter()

    def request(n: int) -> responses.ResponsesRequest:
        user = responses.MessageItem(role="user", content="Go")
        return responses.ResponsesRequest(model="bubo", input=[user, *([item] * n), user])

    assert_linear(request, lambda body: responses_request(converter, body, ()), 5_000)


def test_a_run_of_assistant_items_folds_as_before() -> None:
    call = responses.FunctionCallItem(type="function_call", call_id="c", name="f", arguments="{}")
    text = responses.MessageItem(role="assistant", content="Done.")
    thought = responses.ReasoningItem(
        type="reasoning", content=[responses.ReasoningPart(type="reasoning_text", text="Hm.")]
    )
    body = responses.ResponsesRequest(model="bubo", input=[thought, text, call, call, text, call])
    turns = responses_request(make_converter(), body, ()).request.prompt.messages
    assert [(m.role, m.content, m.reasoning, len(m.tool_calls)) for m in turns] == [
        ("assistant", "Done.", "Hm.", 2),
        ("assistant", "Done.", None, 1),
    ]
