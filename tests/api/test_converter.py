"""The strict converter: no coercion, JSON-type unions, paths in every error."""

from __future__ import annotations

from typing import Any, Literal

import attrs
import pytest

from bubo.api._converter import make_converter, parse_json_object, structure
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
        assert error.param == "items[0].content[0]"
        assert '"text", "image"' in error.message

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

    @pytest.mark.parametrize("value", [2**63 - 1, -(2**63)])
    def test_the_64_bit_bounds(self, value: int) -> None:
        """The 64-bit bounds themselves are integers."""
        assert structure(CONVERTER, {"count": value}, Body).count == value
