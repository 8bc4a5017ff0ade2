"""Reasoning and tool-call parsers: formats, malformed and truncated output, chunking."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubo.domain.messages import ToolSpec
from bubo.domain.output import (
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.parsers import ParserConfig, StreamParser, ThinkParser, make_tool_parser
from bubo.parsers.registry import available_tool_parsers, format_for_template, tool_format

WEATHER = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def config(**fields: object) -> ParserConfig:
    return ParserConfig(tools=(WEATHER,), new_id=ids(), **fields)  # type: ignore[arg-type]


def run(parser: StreamParser, pieces: list[str]) -> list[OutputEvent]:
    events = [e for piece in pieces for e in parser.feed(piece)]
    return coalesce(events + parser.finish())


def coalesce(events: list[OutputEvent]) -> list[OutputEvent]:
    """Join adjacent deltas of the same kind (how a client reassembles them)."""
    out: list[OutputEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(text=last.text + event.text)
        elif isinstance(event, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(text=last.text + event.text)
        elif (
            isinstance(event, ToolCallArgumentsDelta)
            and isinstance(last, ToolCallArgumentsDelta)
            and last.index == event.index
        ):
            out[-1] = ToolCallArgumentsDelta(index=event.index, fragment=last.fragment + event.fragment)
        else:
            out.append(event)
    return [e for e in out if not (isinstance(e, TextDelta | ReasoningDelta) and not e.text)]


def call(index: int, arguments: dict[str, object], name: str = "get_weather") -> list[OutputEvent]:
    return [
        ToolCallStart(index=index, id=f"call_{index}", name=name),
        ToolCallArgumentsDelta(index=index, fragment=json.dumps(arguments, separators=(",", ":"))),
    ]


class TestThink:
    def test_split(self) -> None:
        """<think>…</think> becomes reasoning; the rest is the answer, trimmed at the seam."""
        assert run(ThinkParser(), ["<think>\nLet me see.\n</think>\n\nParis."]) == [
            ReasoningDelta(text="Let me see."),
            TextDelta(text="Paris."),
        ]

    def test_starts_inside(self) -> None:
        """When the prompt opened <think>, the output starts as reasoning."""
        assert run(ThinkParser(starts_inside=True), ["hmm\n</think>\n\nok"]) == [
            ReasoningDelta(text="hmm"),
            TextDelta(text="ok"),
        ]

    def test_no_thinking(self) -> None:
        """An answer without <think> is all answer."""
        assert run(ThinkParser(), ["  <thinking is fun"]) == [TextDelta(text="  <thinking is fun")]

    def test_truncated_reasoning(self) -> None:
        """Output cut inside the reasoning (max tokens) stays reasoning, partial marker included."""
        assert run(ThinkParser(), ["<think>still thinking </thi"]) == [
            ReasoningDelta(text="still thinking </thi")
        ]

    def test_think_later_is_text(self) -> None:
        """<think> after the answer began is just text."""
        assert run(ThinkParser(), ["Hi <think>x</think>"]) == [TextDelta(text="Hi <think>x</think>")]


class TestHermes:
    def parse(self, text: str, **fields: object) -> list[OutputEvent]:
        return run(make_tool_parser("hermes", config(**fields)), [text])

    def test_tagged_call_with_text(self) -> None:
        """Text around a tagged call stays text; the call becomes start + arguments."""
        text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        assert self.parse(text) == [TextDelta(text="Let me check.\n"), *call(0, {"city": "Paris"})]

    def test_parallel_calls(self) -> None:
        """Several calls get increasing indices; whitespace between them is not text."""
        one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
        two = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
        assert self.parse(f"{one}\n\n{two}\n") == [*call(0, {"city": "Oslo"}), *call(1, {"city": "Rome"})]

    def test_max_one_call(self) -> None:
        """With parallel calls off, only the first call is kept."""
        one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
        assert self.parse(one + one, max_calls=1) == call(0, {"city": "Oslo"})

    def test_arguments_as_string_and_parameters_key(self) -> None:
        """Arguments given as a JSON string, or under "parameters", are read."""
        text = '<tool_call>{"name": "get_weather", "parameters": "{\\"city\\": \\"Lima\\"}"}</tool_call>'
        assert self.parse(text) == call(0, {"city": "Lima"})

    def test_end_tag_inside_a_string(self) -> None:
        """An argument containing the end tag does not end the call early (the JSON is read first)."""
        text = '<tool_call>{"name": "get_weather", "arguments": {"city": "</tool_call>"}}</tool_call>'
        assert self.parse(text) == call(0, {"city": "</tool_call>"})

    def test_malformed_call_is_text(self) -> None:
        """A block that is not a JSON call is released as text, tags included."""
        text = "<tool_call>not json</tool_call> done"
        assert self.parse(text) == [TextDelta(text="<tool_call>not json</tool_call> done")]

    def test_truncated_call(self) -> None:
        """A call cut off before its end tag is still a call if its JSON is complete, else text."""
        complete = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        assert self.parse(complete) == call(0, {"city": "Oslo"})
        broken = '<tool_call>{"name": "get_weather", "argu'
        assert self.parse(broken) == [TextDelta(text=broken)]

    @pytest.mark.parametrize(
        "text",
        [
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
            '  ```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```',
            '```\n[{"name": "get_weather", "arguments": {"city": "Oslo"}}]\n```',
        ],
    )
    def test_bare_and_fenced_calls(self, text: str) -> None:
        """A leading bare or fenced call of an offered tool is a call."""
        assert self.parse(text) == call(0, {"city": "Oslo"})

    @pytest.mark.parametrize(
        "text",
        [
            '{"answer": 42}',
            '{"name": "unknown_tool", "arguments": {}}',
            "```python\nprint(1)\n```",
            "[1, 2, 3] are numbers",
            "{not json at all",
        ],
    )
    def test_json_answers_stay_text(self, text: str) -> None:
        """JSON that is not a call of an offered tool stays text, whole."""
        assert self.parse(text) == [TextDelta(text=text)]

    def test_partial_tag_never_leaks(self) -> None:
        """A half-written opening tag is held back until it is decided."""
        parser = make_tool_parser("hermes", config())
        assert parser.feed("Hi <tool_") == [TextDelta(text="Hi ")]
        assert parser.feed("thing") == [TextDelta(text="<tool_thing")]


class TestQwen3Coder:
    def test_xml_parameters_typed_by_schema(self) -> None:
        """Parameters become arguments: strings stay text, other types are read as JSON."""
        text = (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
        )
        assert run(make_tool_parser("qwen3_coder", config()), [text]) == call(
            0, {"city": "New York", "days": 3}
        )

    def test_malformed(self) -> None:
        """A block without a function element is text."""
        text = "<tool_call>\n<parameter=city>\nx\n</parameter>\n</tool_call>"
        assert run(make_tool_parser("qwen3_coder", config()), [text]) == [TextDelta(text=text)]


class TestRegistry:
    def test_unknown_name_lists_the_available_ones(self) -> None:
        """Asking for an unknown format names the registered ones."""
        with pytest.raises(ValueError, match="available: hermes, qwen3_coder, json"):
            tool_format("mistral")

    def test_format_from_template(self) -> None:
        """Qwen3-Coder templates use XML parameters; everything else the Hermes format."""
        assert format_for_template("<tool_call>\n<function={{ name }}>") == "qwen3_coder"
        assert format_for_template("{{ '<tool_call>' }}") == "hermes"
        assert format_for_template("{{ messages }}") == "hermes"


OUTPUTS = [
    (
        "<think>\nPlan: call it.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ),
    (
        "Sure! "
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call> and text after'
    ),
    '```json\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n```',
    "<think>unfinished reasoning <",
    "plain answer with a < sign and </tool_call> stray tag",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
    '{"name": "get_weather", "arg',
]


@settings(max_examples=300, deadline=None)
@given(
    output=st.sampled_from(OUTPUTS) | st.text(alphabet='<>/thinkoolcal_{}":, \nabcAB`json[]', max_size=60),
    cuts=st.lists(st.integers(0, 200), max_size=12),
    fmt=st.sampled_from(available_tool_parsers()),
)
def test_whole_equals_chunked(output: str, cuts: list[int], fmt: str) -> None:
    """Feeding any output whole or in any pieces (one character at a time included) yields the same events."""

    def pipeline(pieces: list[str]) -> list[OutputEvent]:
        think = ThinkParser()
        tools = make_tool_parser(fmt, config())
        events: list[OutputEvent] = []
        for piece in [*pieces, None]:
            parsed = think.feed(piece) if piece is not None else think.finish()
            for event in parsed:
                events.extend(tools.feed(event.text) if isinstance(event, TextDelta) else [event])
        return coalesce(events + tools.finish())

    bounds = sorted({0, len(output), *(c for c in cuts if c <= len(output))})
    pieces = [output[a:b] for a, b in itertools.pairwise(bounds)]
    whole = pipeline([output])
    assert pipeline(pieces) == whole
    assert pipeline(list(output)) == whole
    text = "".join(e.text for e in whole if isinstance(e, TextDelta | ReasoningDelta))
    assert len(text) <= len(output)  # nothing invented; finish() released everything held
