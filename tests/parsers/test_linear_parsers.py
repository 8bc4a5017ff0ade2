"""Model output read in linear time: no parser reads its held text again on every token (issue 36).

Each test streams an adversarial output of n and of 4n characters, a few
characters a feed as a model writes it, and compares the two times
(tests/_linear.py); hypothesis picks what is repeated.  The head scan of a
JSON call once took 28 s of CPU for a 20,000-character head.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from hypothesis import example, given, reject, settings
from hypothesis import strategies as st

from bubo.api.responses._custom_input import CustomInput
from bubo.domain.messages import ToolSpec
from bubo.domain.output import TextDelta, ToolCallArgumentsDelta, ToolCallStart
from bubo.parsers import ParserConfig, StreamParser, ThinkParser, make_tool_parser
from bubo.parsers.tools._json_calls import MAX_HEAD_CHARS
from bubo.parsers.tools._json_prefix import JsonPrefix, Progress
from bubo.parsers.tools.qwen3_coder import _body

from .._linear import assert_linear

# Rescans in Python cost microseconds a character (2,000 show them); rescans in C (json, str.find, a copy)
# cost nanoseconds, so n must be larger before they outgrow the linear work (about 16,000 on this project's CPUs)
N = 2_000
N_HELD = 32_000
FEED_CHARS = 3  # about a token
WEATHER = ToolSpec(
    name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}
)
# what a model might repeat without end: inside strings, between values, around markers
UNITS = st.sampled_from(['"', "\\", '\\"', "\\u00", " ", "\n", "{", "[", "a", ",", ":", "<", "</", "x<tool_call>",
                         '{"a":', "```", "<parameter=", "\\ud83d", "</tool_call", "<function=", "ab"]) | st.text(
    alphabet='{}[]":,\\ \nau<>/`', min_size=1, max_size=6
)  # fmt: skip
slow = settings(max_examples=3, deadline=None)


def config() -> ParserConfig:
    return ParserConfig(tools=(WEATHER,), new_id=lambda: "call_0")


def stream(parser: StreamParser | CustomInput, text: str) -> None:
    """Feed *text* a few characters at a time, then finish."""
    for start in range(0, len(text), FEED_CHARS):
        parser.feed(text[start : start + FEED_CHARS])
    if not isinstance(parser, CustomInput):
        parser.finish()


def repeated(prefix: str, unit: str, suffix: str = "") -> Callable[[int], str]:
    """Outputs of about n characters: *prefix*, *unit* over and over, *suffix*."""
    return lambda n: prefix + unit * (n // len(unit) + 1) + suffix


def tool_parser(name: str) -> Callable[[str], None]:
    return lambda text: stream(make_tool_parser(name, config()), text)


class TestJsonPrefix:
    @settings(max_examples=400, deadline=None)
    @given(
        text=st.text(alphabet='{}[]":,0123456789-+.eEtrufalsnNIy \\u\n\tab', max_size=14),
        opening=st.sampled_from("{["),
        cuts=st.lists(st.integers(0, 4), max_size=6),
    )
    @example(text='"a": tr', opening="{", cuts=[5])
    @example(text='"\\u00', opening="[", cuts=[2])
    def test_it_agrees_with_json(self, text: str, opening: str, cuts: list[int]) -> None:
        """Whatever the pieces: complete where json reads a value (same end), wrong only where json fails."""
        text = opening + text
        reader, pos = JsonPrefix(), 0
        for cut in cuts:
            reader.feed(text[pos : pos + cut])
            pos += cut
        progress = reader.feed(text[pos:])
        try:
            _, end = json.JSONDecoder().raw_decode(text)
        except json.JSONDecodeError:
            assert progress is not Progress.COMPLETE
        except RecursionError:
            reject()  # deeper than Python's own parser: no reference to compare with; another example
        else:
            assert (progress, reader.end) == (Progress.COMPLETE, end)

    @given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                        max_leaves=8).filter(lambda v: isinstance(v, list | dict)),
           st.booleans())  # fmt: skip
    def test_a_value_being_written_is_partial_until_its_last_character(
        self, value: object, ascii_: bool
    ) -> None:
        text = json.dumps(value, ensure_ascii=ascii_)
        reader = JsonPrefix()
        for index, char in enumerate(text):
            progress = reader.feed(char)
            assert progress is (Progress.COMPLETE if index == len(text) - 1 else Progress.PARTIAL), text[
                : index + 1
            ]
        assert reader.end == len(text)

    @slow
    @given(UNITS)
    def test_linear(self, unit: str) -> None:
        assert_linear(repeated('{"a": ["', unit), stream_json, N_HELD)


def stream_json(text: str) -> None:
    reader = JsonPrefix()
    for start in range(0, len(text), FEED_CHARS):
        reader.feed(text[start : start + FEED_CHARS])


class TestToolCallParsers:
    def test_a_head_too_long_is_read_whole(self) -> None:
        """A call whose head runs past the bound is still a call: read whole once its JSON closes."""
        text = '{"name": "get_weather",' + " " * MAX_HEAD_CHARS + '"arguments": {"city": "Oslo"}}'
        parser = make_tool_parser("hermes", config())
        events = [e for start in range(0, len(text), 3) for e in parser.feed(text[start : start + 3])]
        events += parser.finish()
        assert [type(e) for e in events] == [ToolCallStart, ToolCallArgumentsDelta]
        assert json.loads(events[1].fragment) == {"city": "Oslo"}  # type: ignore[union-attr]

    @slow
    @given(UNITS, st.sampled_from(["hermes", "json"]))
    @example('"', "hermes")  # the endless head the review measured: a name that never closes
    @example("a", "hermes")
    def test_a_head_that_never_ends(self, unit: str, fmt: str) -> None:
        assert_linear(repeated('{"name": "', unit), tool_parser(fmt), N)

    @slow
    @given(UNITS, st.sampled_from(["hermes", "qwen3_coder"]),
           st.sampled_from(['<tool_call>{"arguments": {"x": "', "<tool_call>[1, ", "<tool_call>not json "]))  # fmt: skip
    @example("a", "hermes", '<tool_call>{"arguments": {"x": "')
    def test_a_tagged_body_held_whole(self, unit: str, fmt: str, prefix: str) -> None:
        """Bodies of another shape, or no call at all, are held until their end marker."""
        assert_linear(repeated(prefix, unit), tool_parser(fmt), N_HELD)

    @slow
    @given(UNITS, st.sampled_from(['{"arguments": {"x": "', '[{"parameters": ', "```json\n[", "``` "]))
    @example("a", '{"arguments": {"x": "')
    def test_a_leading_body_held_whole(self, unit: str, prefix: str) -> None:
        assert_linear(repeated(prefix, unit), tool_parser("json"), N_HELD)

    @slow
    @given(UNITS, st.sampled_from(["hermes", "qwen3_coder"]))
    def test_text_after_a_call_before_its_end_marker(self, unit: str, fmt: str) -> None:
        call = {
            "hermes": '<tool_call>{"name": "get_weather", "arguments": {}}',
            "qwen3_coder": "<tool_call>\n<function=get_weather>\n</function>",
        }[fmt]
        assert_linear(repeated(call, unit), tool_parser(fmt), N_HELD)

    @slow
    @given(st.sampled_from([" ", "\n", " \t"]), st.sampled_from(["hermes", "json", "qwen3_coder"]))
    def test_white_space_before_anything(self, unit: str, fmt: str) -> None:
        assert_linear(repeated("", unit, "Hello"), tool_parser(fmt), N_HELD)

    @slow
    @given(UNITS, st.sampled_from(["<tool_call>\n<function=", "<tool_call><function=get_weather>\n<parameter=",
                                   "<tool_call><function=get_weather>\n<parameter=city>\n",
                                   "<tool_call><function=get_weather>\n"]))  # fmt: skip
    @example(" ", "<tool_call><function=get_weather>\n")
    def test_xml_heads_and_parameters(self, unit: str, prefix: str) -> None:
        assert_linear(repeated(prefix, unit), tool_parser("qwen3_coder"), N_HELD)

    @slow
    @given(
        st.sampled_from(["<parameter=a>", "<parameter=a>x", "</function> ", "<parameter=a>\n</parameter>"])
    )
    def test_a_whole_xml_body(self, unit: str) -> None:
        """One scan of a whole body: a regex looked for each "</parameter>" from every "<parameter=" (n²)."""
        assert_linear(
            repeated("<function=get_weather>", unit, "</function>"), lambda t: _body(t, config()), 10 * N
        )

    def test_a_whole_xml_body_reads_as_before(self) -> None:
        body = "<function=get_weather>\n<parameter=city>\nA\nB\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        (call,) = _body(body + "</function>", config()) or []
        assert json.loads(call.arguments) == {"city": "A\nB", "days": 3}
        assert _body(body + "<parameter=x>\n</function>", config()) is None  # an unclosed parameter
        assert _body(body + "junk</function>", config()) is None


class TestThink:
    @slow
    @given(UNITS, st.sampled_from(["", "<think>", "<think>x"]))
    @example(" ", "<think>x")
    @example(" ", "")
    def test_reasoning_and_white_space(self, unit: str, prefix: str) -> None:
        assert_linear(repeated(prefix, unit), lambda text: stream(ThinkParser(), text), N_HELD)

    def test_held_white_space_is_released_as_before(self) -> None:
        parser = ThinkParser()
        events = parser.feed("  ") + parser.feed(" \n") + parser.feed("Hi")
        assert events == [TextDelta(text="   \nHi")]
        parser = ThinkParser(starts_inside=True)
        events = (
            parser.feed("a ")
            + parser.feed("  ")
            + parser.feed("b  ")
            + parser.feed("</think>")
            + parser.finish()
        )
        assert "".join(e.text for e in events) == "a   b"  # type: ignore[union-attr]


class TestCustomToolInput:
    @slow
    @given(UNITS.filter(lambda unit: '"' not in unit.replace('\\"', "")))
    @example("\\ud83d\\ude00")
    @example("\\u00e9")
    def test_linear(self, unit: str) -> None:
        assert_linear(repeated('{"input":"', unit), lambda text: stream(CustomInput(), text), N_HELD)

    @given(st.text(max_size=40), st.lists(st.integers(0, 8), max_size=10))
    def test_pieces_decode_to_the_input(self, text: str, cuts: list[int]) -> None:
        """However the arguments are cut, the deltas join to the input (surrogate pairs and escapes whole)."""
        arguments = json.dumps({"input": text})
        decoder, pos, out = CustomInput(), 0, []
        for cut in cuts:
            out.append(decoder.feed(arguments[pos : pos + cut]))
            pos += cut
        out.append(decoder.feed(arguments[pos:]))
        assert "".join(out) == text
