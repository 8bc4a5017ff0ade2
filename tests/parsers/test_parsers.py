"""Reasoning and tool-call parsers: formats, malformed and truncated output, chunking."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubo.domain.messages import InputGrammar, ToolSpec
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


class TestStreamingAsGenerated:
    """Only what could still begin a call is held back; a call's arguments stream as they are generated."""

    @staticmethod
    def feed_each(fmt: str, pieces: list[str]) -> list[list[OutputEvent]]:
        parser = make_tool_parser(fmt, config())
        return [parser.feed(piece) for piece in pieces]

    @pytest.mark.parametrize("fmt", available_tool_parsers())
    def test_plain_text_is_released_at_once(self, fmt: str) -> None:
        """With tools offered, each piece of a plain answer comes out as it is fed."""
        pieces = ["The", " bug", " is", " on", " line", " 2."]
        assert self.feed_each(fmt, pieces) == [[TextDelta(text=piece)] for piece in pieces]

    @pytest.mark.parametrize("fmt", ["hermes", "json"])
    def test_json_that_is_no_call_is_released_at_its_first_key(self, fmt: str) -> None:
        """A leading JSON answer is text once its first key shows it is no call; nothing waits for its end."""
        out = self.feed_each(fmt, ['{"', 'answer"', ": 42", "}"])
        assert out[:2] == [[], [TextDelta(text='{"answer"')]]
        assert out[2:] == [[TextDelta(text=": 42")], [TextDelta(text="}")]]

    @pytest.mark.parametrize(
        ("fmt", "opening"),
        [
            ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": '),
            ("hermes", '{"name": "get_weather", "arguments": '),
            ("hermes", '```json\n[{"name": "get_weather", "arguments": '),
            ("json", '{"name": "get_weather", "arguments": '),
        ],
    )
    def test_a_call_starts_at_its_name_and_streams_its_arguments(self, fmt: str, opening: str) -> None:
        """The start comes with the arguments key; each later piece of arguments is its own delta, compacted."""
        out = self.feed_each(fmt, [opening, '{"city": "Pa', 'ris", "days"', ": 3}"])
        assert out[0] == [ToolCallStart(index=0, id="call_0", name="get_weather")]
        assert out[1:] == [
            [ToolCallArgumentsDelta(index=0, fragment='{"city":"Pa')],
            [ToolCallArgumentsDelta(index=0, fragment='ris","days"')],
            [ToolCallArgumentsDelta(index=0, fragment=":3}")],
        ]

    def test_a_second_call_of_an_array_streams_too(self) -> None:
        """Calls in one JSON array come one after the other, each as it is written."""
        text = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]'
        assert run(make_tool_parser("hermes", config()), list(text)) == [
            *call(0, {"city": "Oslo"}),
            *call(1, {"city": "Rome"}),
        ]

    def test_qwen3_coder_string_parameters_stream(self) -> None:
        """An XML call starts at <function=…>; a string parameter's text streams before </parameter>."""
        out = self.feed_each(
            "qwen3_coder",
            ["<tool_call>\n<function=get_weather>\n", "<parameter=city>\nNew", " York", "\n</parameter>\n", "</function>\n</tool_call>"],
        )  # fmt: skip
        assert out[0] == [ToolCallStart(index=0, id="call_0", name="get_weather")]
        assert out[1] == [ToolCallArgumentsDelta(index=0, fragment='{"city":"New')]
        assert out[2] == [ToolCallArgumentsDelta(index=0, fragment=" York")]
        assert out[3:] == [
            [ToolCallArgumentsDelta(index=0, fragment='"')],
            [ToolCallArgumentsDelta(index=0, fragment="}")],
        ]

    def test_a_call_cut_short_keeps_what_was_streamed(self) -> None:
        """Output cut inside a started call's arguments ends the call there (finish_reason says length)."""
        events = run(
            make_tool_parser("hermes", config()),
            ['<tool_call>{"name": "get_weather", "arguments": {"city": "Os'],
        )
        assert events == [
            ToolCallStart(index=0, id="call_0", name="get_weather"),
            ToolCallArgumentsDelta(index=0, fragment='{"city":"Os'),
        ]


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
    '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {"days": 1}}]',
    '{"answer": 1} then <tool_call>{"name": "get_weather", "arguments": {"days": 2}}</tool_call>',
    '<tool_call>{"name": "get_weather", "parameters": "{\\"city\\": \\"Lima\\"}"}</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "x"}}\n{"name": "get_weather", "arguments": {}}</tool_call>',
    "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=city>\nA\nB\n</parameter>\n</function>",
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


class TestFreeformCallGrammars:
    TOOL = ToolSpec(
        name="note",
        parameters={"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
        input_grammar=InputGrammar(
            argument="input", syntax="lark", definition='start: "a" LF\n%import common.LF'
        ),
    )

    @pytest.mark.parametrize(
        ("name", "newline"),
        [("hermes", '"\\x5Cn"'), ("json", '"\\x5Cn"'), ("qwen3_coder", '"\\x0A"')],
    )
    def test_a_forced_freeform_call_is_written_in_its_grammar(self, name: str, newline: str) -> None:
        """Every format puts the input's grammar where the input goes: JSON-escaped in JSON calls, raw in XML."""
        grammar = tool_format(name).grammar([self.TOOL], prefix="", max_calls=1)
        assert grammar.schemas == ()
        assert f"-1-lf ::= {newline}" in grammar.rules
