"""The strict converter: no coercion, JSON-type unions, paths in every error."""

from __future__ import annotations

import itertools
import typing
from typing import Any, Literal

import attrs
import pytest

from bubo.api._converter import make_converter, parse_json_object, structure
from bubo.api.openai.wire import CompletionRequest
from bubo.errors import InvalidRequest


@attrs.frozen(kw_only=True)
class Text:
    type: Literal["text"]
    text: str


@attrs.frozen(kw_only=True)
class Image:
    type: Literal["image"]
    url: str


@attrs.frozen(kw_only=True)
class Item:
    role: Literal["user", "assistant"]
    content: str | list[Text | Image] | None = None


@attrs.frozen(kw_only=True)
class Body:
    count: int | None = None
    ratio: float | None = None
    flag: bool | None = None
    name: str | None = None
    items: list[Item] | None = None
    extra: dict[str, Any] | None = None


CONVERTER = make_converter()


def error_of(data: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        structure(CONVERTER, data, Body)
    return caught.value


class TestStrictPrimitives:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"count": "3"}, "expected an integer or null, got string @ $.count"),
            ({"count": True}, "expected an integer or null, got boolean @ $.count"),
            ({"count": 1.5}, "expected an integer or null, got number @ $.count"),
            ({"ratio": "0.5"}, "expected a number or null, got string @ $.ratio"),
            ({"ratio": False}, "expected a number or null, got boolean @ $.ratio"),
            ({"flag": "false"}, "expected a boolean or null, got string @ $.flag"),
            ({"flag": 0}, "expected a boolean or null, got integer @ $.flag"),
            ({"name": 5}, "expected a string or null, got integer @ $.name"),
            ({"extra": []}, "expected an object or null, got array @ $.extra"),
        ],
    )
    def test_no_coercion(self, data, message) -> None:
        """Values of the wrong JSON type are rejected, never coerced."""
        error = error_of(data)
        assert error.message == message
        assert error.code == "parse_error"

    def test_integral_float_is_an_integer(self) -> None:
        """2.0 is accepted where an integer is expected (JavaScript clients send it)."""
        assert structure(CONVERTER, {"count": 2.0}, Body).count == 2

    def test_integers_are_numbers(self) -> None:
        """An integer is a valid number."""
        assert structure(CONVERTER, {"ratio": 1}, Body).ratio == 1.0


class TestUnionsAndPaths:
    def test_content_string_or_parts(self) -> None:
        """A string-or-parts union picks by JSON type, parts by their type tag."""
        body = structure(
            CONVERTER,
            {
                "items": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "a"}, {"type": "image", "url": "u"}],
                    },
                ]
            },
            Body,
        )
        assert body.items is not None
        assert body.items[1].content == [Text(type="text", text="a"), Image(type="image", url="u")]

    def test_unknown_tag(self) -> None:
        """An unknown type tag lists the known ones."""
        error = error_of({"items": [{"role": "user", "content": [{"type": "video"}]}]})
        assert error.param == "items[0].content[0].type"
        assert '"image", "text"' in error.message

    def test_missing_tag(self) -> None:
        """A part without a type tag (and no default member) names the tag and the known values."""
        error = error_of({"items": [{"role": "user", "content": [{"text": "a"}]}]})
        assert error.message == 'required field missing, one of "image", "text" @ $.items[0].content[0].type'

    def test_nested_path_and_every_error(self) -> None:
        """Every bad field is reported; param is the first one's path."""
        error = error_of({"items": [{"role": "user"}, {"role": "robot"}, {}], "count": "x"})
        assert error.param is not None
        assert "@ $.items[1].role" in error.message
        assert "required field missing @ $.items[2].role" in error.message
        assert "@ $.count" in error.message

    def test_unknown_keys_are_ignored(self) -> None:
        """Unknown fields do not fail the request."""
        assert structure(CONVERTER, {"count": 1, "whatever": [1, 2]}, Body).count == 1


@attrs.frozen(kw_only=True)
class Note:
    """A tagged member whose ``type`` may be omitted: the default of its union."""

    type: Literal["note"] | None = None
    text: str


class TestUnionResolution:
    """A union is resolved by the value's JSON type, never by the order its members are written in."""

    UNIONS: typing.ClassVar = [
        (str, list[int | str], list[list[int]], None),
        (int, float, None),
        (Text, Image, Note),
        (Literal["auto", "none"], Text, list[str], None),
        (list[Text | Image], dict[str, Any], bool),
    ]
    VALUES: typing.ClassVar = [
        None, True, 0, 2.0, 2.5, 2**70, "s", "auto", [], [1, "a"], [[1, 2]], [1, [2]], [[1, "a"]], [True],
        ["a"], [{"type": "text", "text": "a"}], {}, {"type": "text", "text": "a"}, {"type": "image", "url": "u"},
        {"text": "a"}, {"type": "video"}, {"a": 1},
    ]  # fmt: skip

    @staticmethod
    def outcome(tp: Any, value: Any) -> tuple[str, Any]:
        # a converter of its own: cattrs caches one hook for equal unions, whatever their order
        try:
            result = structure(make_converter(), value, tp)
        except InvalidRequest as error:
            return "error", (error.param, error.message)
        return "value", (type(result), result)

    @pytest.mark.parametrize("members", UNIONS, ids=str)
    def test_member_order_does_not_change_the_result(self, members: tuple[Any, ...]) -> None:
        """Every order of a union's members structures every value alike: same result or same error."""
        orders = [typing.Union[order] for order in itertools.permutations(members)]  # noqa: UP007
        for value in self.VALUES:
            outcomes = {repr(self.outcome(tp, value)) for tp in orders}
            assert len(outcomes) == 1, (members, value, outcomes)

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            ([[1, 2]], [[1, 2]]),
            ([1, "a"], [1, "a"]),
            ([], []),
            (2.0, 2),
        ],
    )
    def test_arrays_are_told_apart_by_their_first_item(self, value: Any, expected: Any) -> None:
        """A list of token lists is not refused because a list of tokens is declared first."""
        tp = str | list[int | str] | list[list[int]] | int | None
        assert structure(CONVERTER, value, tp) == expected

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ([True], "expected an integer or a string or an array, got boolean @ $[0]"),
            ([[1, "a"]], "expected an integer, got string @ $[0][1]"),
            ([1, [2]], "expected an integer or a string, got array @ $[1]"),
            ({}, "expected a string or an array or null, got object @ $"),
        ],
    )
    def test_a_bad_array_names_its_item(self, value: Any, message: str) -> None:
        """An error inside one of several array members names the item's path."""
        with pytest.raises(InvalidRequest) as caught:
            structure(CONVERTER, value, str | list[int | str] | list[list[int]] | None)
        assert caught.value.message == message

    def test_a_completion_prompt_may_be_a_list_of_one_token_list(self) -> None:
        """/v1/completions documents a list holding token ids; its first declared array member does not refuse it."""
        assert structure(CONVERTER, {"prompt": [[1, 2]]}, CompletionRequest).prompt == [[1, 2]]

    def test_exact_json_types_win_over_widening(self) -> None:
        """1 is an int and 1.5 a float in int | float; 2.0 is a float there, an int where only int is."""
        assert [structure(CONVERTER, v, float | int) for v in (1, 1.5, 2.0)] == [1, 1.5, 2.0]
        assert [type(structure(CONVERTER, v, float | int)) for v in (1, 1.5, 2.0)] == [int, float, float]
        assert type(structure(CONVERTER, 2.0, int | None)) is int

    def test_a_default_member_takes_objects_without_a_tag(self) -> None:
        """The member whose type may be omitted structures an object without one; a known tag still wins."""
        tp = Text | Image | Note
        assert structure(CONVERTER, {"text": "a"}, tp) == Note(text="a")
        assert structure(CONVERTER, {"type": "text", "text": "a"}, tp) == Text(type="text", text="a")
        with pytest.raises(InvalidRequest) as caught:
            structure(CONVERTER, {"type": "video", "text": "a"}, tp)
        assert caught.value.message == 'expected one of "image", "note", "text", got "video" @ $.type'

    @pytest.mark.parametrize(
        "tp", [list[Text] | list[dict[str, Any]], dict[str, Any] | Text, Item | Body], ids=str
    )
    def test_an_ambiguous_union_is_refused_when_its_hook_is_built(self, tp: Any) -> None:
        """A union whose members take the same JSON values is a programming error, not a coin toss."""
        with pytest.raises(TypeError, match=r"cannot tell|several members"):
            make_converter().get_structure_hook(tp)


class TestJsonTypes:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"items": "ab"}, "expected an array or null, got string @ $.items"),
            ({"items": {"role": "user"}}, "expected an array or null, got object @ $.items"),
            ({"extra": [["a", 1]]}, "expected an object or null, got array @ $.extra"),
            (
                {"items": [{"role": "user", "content": "a"}, "b"]},
                "expected an object, got string @ $.items[1]",
            ),
        ],
    )
    def test_containers_take_their_own_json_type(self, data: Any, message: str) -> None:
        """A string is not a list of characters, and pairs are not an object."""
        assert error_of(data).message == message

    def test_an_object_value_names_its_key(self) -> None:
        """A bad value inside a mapping is reported at its key."""
        error = error_of(
            {"extra": {"a": 1}, "items": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
        )
        assert error.param == "items[0].content[0].text"
        assert structure(CONVERTER, {"extra": {"a": [1]}}, Body).extra == {"a": [1]}


class TestJsonBody:
    @pytest.mark.parametrize("body", [b"", b"   ", b"{", b"[]", b"null", b"3", b'{"a": Infinity}', b"\xff"])
    def test_rejected(self, body: bytes) -> None:
        """Anything but a JSON object is a parse_error."""
        with pytest.raises(InvalidRequest) as caught:
            parse_json_object(body)
        assert caught.value.code == "parse_error"

    def test_object(self) -> None:
        """An object parses."""
        assert parse_json_object(' {"a": [1, "é"]} '.encode()) == {"a": [1, "é"]}

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            (b'{"a": [1, {"b": "x\\ud800"}]}', "a[1].b"),
            (b'{"a": {"\\udc00": 1}}', "a"),
            (b'{"\\ud800": 1}', None),
            (b'{"a": "\xed\xa0\x80"}', "a"),
            ('{"a": "\ud800"}'.encode("utf-16-le", "surrogatepass"), "a"),
            (b'{"a": {"b": [0.5, 1e309]}}', "a.b[1]"),
            (b'{"a": -1E400}', "a"),
        ],
    )
    def test_values_no_field_can_use(self, body: bytes, param: str | None) -> None:
        """A lone surrogate or an infinite number is a parse_error naming where it is, never echoing it."""
        with pytest.raises(InvalidRequest) as caught:
            parse_json_object(body)
        assert (caught.value.code, caught.value.param) == ("parse_error", param)
        caught.value.message.encode("utf-8")  # the message itself is valid Unicode

    def test_surrogate_pairs_and_large_finite_numbers_parse(self) -> None:
        """A surrogate pair is one character; 1.7e308 is finite."""
        assert parse_json_object(b'{"a": "\\ud83d\\ude00", "b": 1.7e308}') == {
            "a": "\U0001f600",
            "b": 1.7e308,
        }


class TestIntegerWidth:
    @pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**70, 1e30])
    def test_beyond_64_bits(self, value: float) -> None:
        """An integer field takes at most 64 bits (every one ends in a C integer)."""
        error = error_of({"count": value})
        assert error.param == "count"
        assert "expected an integer that fits in 64 bits" in error.message

    def test_an_integer_too_large_for_a_number(self) -> None:
        """A number field takes an integer only if it fits in a double."""
        error = error_of({"ratio": 10**400})
        assert (error.param, error.message) == (
            "ratio",
            "expected a finite number, got an integer of 401 digits @ $.ratio",
        )

    @pytest.mark.parametrize("value", [2**63 - 1, -(2**63)])
    def test_the_64_bit_bounds(self, value: int) -> None:
        """The 64-bit bounds themselves are integers."""
        assert structure(CONVERTER, {"count": value}, Body).count == value
