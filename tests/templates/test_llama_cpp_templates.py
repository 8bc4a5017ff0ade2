"""llama.cpp's own chat templates (models/templates) render in Bubo exactly as llama.cpp's engine renders them.

``tests/fixtures/llama_cpp_templates`` holds the templates llama.cpp tests with and,
in ``renders.json``, what llama.cpp's Jinja engine (``common/jinja``) rendered for
each with the same variables (``README.md`` there says how they were made).  Each
template renders here to the same text, or is refused where llama.cpp refused it;
the tests after that show, on the full ``render`` path, the context llama.cpp adds
(today's date, FireFunction's functions) and its forgiving operators.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from bubo.domain.messages import ChatPrompt, Message, ToolCall, ToolSpec
from bubo.errors import InvalidRequest
from bubo.templates import ChatTemplate

FIXTURES = Path(__file__).parent.parent / "fixtures" / "llama_cpp_templates"
REFERENCE: dict[str, Any] = json.loads((FIXTURES / "renders.json").read_text(encoding="utf-8"))
NOW = dt.datetime.fromisoformat(REFERENCE["now"])
CASES = [(name, scenario) for name, renders in REFERENCE["renders"].items() for scenario in renders]
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def _fixed_clock() -> dt.datetime:
    return NOW


@functools.cache
def reference_template(name: str) -> ChatTemplate:
    """*name* compiled and probed once for all its scenarios, on the reference's clock."""
    return template(name)


def template(name: str, *, clock: Any = _fixed_clock) -> ChatTemplate:
    source = (FIXTURES / name).read_text(encoding="utf-8")
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>", origin=f"file:{name}", clock=clock)


@pytest.mark.parametrize(
    ("name", "scenario"), CASES, ids=[f"{n.removesuffix('.jinja')}-{s}" for n, s in CASES]
)
def test_renders_what_llama_cpp_renders(name: str, scenario: str) -> None:
    """Every template of llama.cpp's collection, with every scenario, gives llama.cpp's text to the byte."""
    variables = {**REFERENCE["tokens"], **REFERENCE["scenarios"][scenario]}
    expected = REFERENCE["renders"][name][scenario]
    if expected is None:  # the template itself refuses the scenario (raise_exception), in llama.cpp too
        with pytest.raises(Exception, match=r"."):
            reference_template(name).render_variables(variables)
        return
    assert reference_template(name).render_variables(variables) == expected


def test_every_template_is_covered() -> None:
    """The reference holds every template of the folder, and almost all render (refusals are the templates')."""
    names = sorted(p.name for p in FIXTURES.glob("*.jinja"))
    assert names == sorted(REFERENCE["renders"])
    refusals = [(n, s) for n, s in CASES if REFERENCE["renders"][n][s] is None]
    assert len(names) >= 70
    assert len(refusals) <= 4


USER = (Message(role="user", content="What is the weather in Paris?"),)


class TestLlama3Date:
    @pytest.mark.parametrize(
        "name",
        [
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
        ],
    )
    def test_today_not_the_fallback_date(self, name: str) -> None:
        """Llama 3.x templates are told today's date, as llama.cpp tells them, not their 26 Jul 2024."""
        today = dt.datetime.now().astimezone()
        text = template(name, clock=lambda: today).render(ChatPrompt(messages=USER))
        assert f"Today Date: {today.strftime('%d %b %Y')}\n" in text
        assert "26 Jul 2024" not in text

    def test_the_server_clock_is_the_default(self) -> None:
        """Without a clock given, the date is the machine's today."""
        source = (FIXTURES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text(encoding="utf-8")
        before = dt.datetime.now().astimezone().strftime("%d %b %Y")
        text = ChatTemplate(
            source, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", origin="test"
        ).render(ChatPrompt(messages=USER))
        after = dt.datetime.now().astimezone().strftime("%d %b %Y")  # the render may cross midnight
        assert f"Today Date: {before}\n" in text or f"Today Date: {after}\n" in text

    def test_a_request_may_set_the_date(self) -> None:
        """chat_template_kwargs come last, as in llama-server: a request can pin date_string."""
        prompt = ChatPrompt(messages=USER, template_kwargs={"date_string": "01 Jan 2030"})
        assert "Today Date: 01 Jan 2030\n" in template("meta-llama-Llama-3.1-8B-Instruct.jinja").render(
            prompt
        )

    def test_tools_render_natively(self) -> None:
        """The Llama 3.1 template describes tools itself: no generic section is added."""
        tmpl = template("meta-llama-Llama-3.1-8B-Instruct.jinja")
        assert tmpl.capabilities.tools
        text = tmpl.render(ChatPrompt(messages=USER, tools=(WEATHER,)))
        assert '"name": "get_weather"' in text
        assert "<tools>" not in text


class TestFireFunction:
    NAME = "fireworks-ai-llama-3-firefunction-v2.jinja"

    def test_functions_and_datetime(self) -> None:
        """FireFunction v2 reads functions (the tools as indented JSON) and datetime; it renders, with both."""
        tmpl = template(self.NAME)
        text = tmpl.render(ChatPrompt(messages=USER, tools=(WEATHER,)))
        assert tmpl.capabilities.tools
        assert 'Available functions as JSON spec:\n[\n  {\n    "type": "function",' in text
        assert '"name": "get_weather"' in text
        assert "\nToday is Dec 02 2025." in text
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")

    def test_without_tools(self) -> None:
        """Without tools functions is empty, as llama.cpp gives it."""
        text = template(self.NAME).render(ChatPrompt(messages=USER))
        assert "Available functions as JSON spec:\n\nToday is Dec 02 2025." in text

    def test_tool_calls_round_trip(self) -> None:
        """An earlier call is printed in the template's functools[…] form."""
        prompt = ChatPrompt(
            messages=(
                *USER,
                Message(
                    role="assistant",
                    content="",
                    tool_calls=(ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}'),),
                ),
                Message(role="tool", content="sunny", tool_call_id="c1"),
            ),
            tools=(WEATHER,),
        )
        text = template(self.NAME).render(prompt)
        assert ' functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|eot_id|>' in text


class TestArguments:
    CALL = ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')

    def prompt(self) -> ChatPrompt:
        return ChatPrompt(
            messages=(*USER, Message(role="assistant", content="", tool_calls=(self.CALL,))),
            tools=(WEATHER,),
            add_generation_prompt=False,
        )

    def test_templates_that_print_objects_get_objects(self) -> None:
        """Llama 3.1 prints arguments with tojson: it is given the object."""
        tmpl = template("meta-llama-Llama-3.1-8B-Instruct.jinja")
        assert tmpl.capabilities.object_arguments
        assert '"parameters": {"city": "Paris"}' in tmpl.render(self.prompt())

    def test_templates_that_join_text_get_text(self) -> None:
        """Functionary v3.2 joins arguments to a string: it is given their JSON text, as llama.cpp gives it."""
        tmpl = template("meetkai-functionary-medium-v3.2.jinja")
        assert not tmpl.capabilities.object_arguments
        assert '>>>get_weather\n{"city": "Paris"}' in tmpl.render(self.prompt())


def render_source(source: str, **variables: Any) -> str:
    tmpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>", origin="test", clock=_fixed_clock)
    return tmpl.render_variables({"messages": [], **variables})


class TestEnvironment:
    def test_strftime_now_reads_the_clock(self) -> None:
        """strftime_now formats the server's now."""
        assert render_source("{{ strftime_now('%Y-%m-%d %H:%M') }}") == "2025-12-02 09:30"

    def test_date_variables(self) -> None:
        """date_string and datetime are llama.cpp's two spellings of today."""
        assert render_source("{{ date_string }}|{{ datetime }}") == "02 Dec 2025|Dec 02 2025"

    @pytest.mark.parametrize(
        ("expression", "expected"),
        [
            ("{{ x | tojson }}", '{"b": [1, 2], "a": "é"}'),
            ("{{ x | tojson(indent=2) }}", '{\n  "b": [\n    1,\n    2\n  ],\n  "a": "é"\n}'),
            ("{{ x | tojson(separators=(',', ':')) }}", '{"b":[1,2],"a":"é"}'),
            ("{{ x | tojson(sort_keys=true) }}", '{"a": "é", "b": [1, 2]}'),
            ("{{ x | tojson(ensure_ascii=true) }}", '{"b": [1, 2], "a": "\\u00e9"}'),
            ("{{ x.b | map('string') | tojson }}", '["1", "2"]'),
        ],
    )
    def test_tojson_options(self, expression: str, expected: str) -> None:
        """tojson takes Python's options, and a filter's generator as a list."""
        assert render_source(expression, x={"b": [1, 2], "a": "é"}) == expected

    @pytest.mark.parametrize(
        ("expression", "expected"),
        [
            ("{{ 'a' + none }}", "a"),
            ("{{ missing + 'a' }}", "a"),
            ("{{ 'n=' + 3 }}", "n=3"),
            ("{{ missing.deeper.still | length }}", "0"),
            ("{{ ('<' | safe) + '\"' }}", '<"'),
            ("{% set ns = namespace(items=[]) %}{% set _ = ns.items.append(1) %}{{ ns.items }}", "[1]"),
        ],
    )
    def test_llama_cpp_leniency(self, expression: str, expected: str) -> None:
        """What llama.cpp's engine forgives renders here too instead of failing the request."""
        assert render_source(expression) == expected

    def test_raise_exception_is_the_templates_400(self) -> None:
        """raise_exception still refuses, with the template's message."""
        tmpl = template("google-gemma-2-2b-it.jinja")
        with pytest.raises(InvalidRequest, match="Conversation roles must alternate"):
            tmpl.render(ChatPrompt(messages=(*USER, *USER)))

    def test_the_sandbox_still_holds(self) -> None:
        """Mutable lists do not open private attributes."""
        with pytest.raises(InvalidRequest):
            ChatTemplate("{{ ''.__class__.__mro__ }}", bos_token="", eos_token="", origin="test").render(
                ChatPrompt(messages=USER)
            )
