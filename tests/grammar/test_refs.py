"""References in a request's JSON schema: resolved inside the schema as Draft 2020-12 says, or a 400.

``check_schema`` returns the schema to enforce and to validate against: the
request's own when it declares and refers to nothing, else a bundled copy in
which every ``$ref`` is a pointer from the root and no ``$id``/``$anchor`` is
left to change a base URI.  Nothing here, or anywhere, is fetched.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bubo.errors import InvalidRequest
from bubo.grammar import check_schema

PARAM = "tools[0].function.parameters"

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def bundled(schema: dict[str, Any]) -> Any:
    original = copy.deepcopy(schema)
    result = check_schema(schema, PARAM)
    assert schema == original  # the request's schema is never changed
    return result


def refusal(schema: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_schema(schema, PARAM)
    assert caught.value.code == "unsupported_schema"
    return caught.value


class TestResolved:
    def test_a_schema_without_references_is_returned_as_it_came(self) -> None:
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        assert check_schema(schema, PARAM) == schema

    def test_defs_behind_a_relative_root_id(self) -> None:
        """What instructor and other libraries send: a root ``$id`` that is no URL, refs relative to it."""
        schema = {
            "$id": "args-0",
            "type": "object",
            "$defs": {"Person": PERSON},
            "properties": {"tasks": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
        }
        assert bundled(schema) == {
            "type": "object",
            "$defs": {"Person": PERSON},
            "properties": {"tasks": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
        }

    def test_a_reference_by_the_root_ids_own_name(self) -> None:
        schema = {
            "$id": "https://example.com/root.json",
            "$defs": {"P": PERSON},
            "items": {"$ref": "root.json#/$defs/P"},
        }
        assert bundled(schema)["items"] == {"$ref": "#/$defs/P"}

    def test_a_nested_id_is_the_base_of_references_inside_it(self) -> None:
        """``#/$defs/B`` inside the resource ``urn:example:inner`` is that resource's ``$defs``, not the root's."""
        schema = {
            "$defs": {
                "B": {"type": "integer"},
                "Inner": {
                    "$id": "urn:example:inner",
                    "$defs": {"B": {"type": "string"}},
                    "$ref": "#/$defs/B",
                },
            },
            "properties": {"x": {"$ref": "urn:example:inner"}, "y": {"$ref": "#/$defs/B"}},
        }
        result = bundled(schema)
        assert result["$defs"]["Inner"] == {
            "$defs": {"B": {"type": "string"}},
            "$ref": "#/$defs/Inner/$defs/B",
        }
        assert result["properties"] == {"x": {"$ref": "#/$defs/Inner"}, "y": {"$ref": "#/$defs/B"}}

    def test_relative_ids_resolve_against_their_parents(self) -> None:
        schema = {
            "$id": "https://example.com/schemas/root.json",
            "$defs": {"Tree": {"$id": "tree/node.json", "$defs": {"Leaf": {"type": "string"}}}},
            "properties": {"leaf": {"$ref": "tree/node.json#/$defs/Leaf"}},
        }
        assert bundled(schema)["properties"]["leaf"] == {"$ref": "#/$defs/Tree/$defs/Leaf"}

    def test_anchors(self) -> None:
        schema = {
            "$defs": {"n": {"$anchor": "name", "type": "string"}, "m": {"$id": "#legacy", "type": "integer"}},
            "properties": {"a": {"$ref": "#name"}, "b": {"$ref": "#legacy"}},
        }
        result = bundled(schema)
        assert result["properties"] == {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/m"}}
        assert result["$defs"] == {"n": {"type": "string"}, "m": {"type": "integer"}}

    def test_pointers_with_escapes_and_into_arrays(self) -> None:
        schema = {
            "$defs": {"a/b": {"type": "string"}, "c d": {"type": "integer"}, "t~": {"type": "boolean"}},
            "anyOf": [{"type": "null"}, {"type": "number"}],
            "properties": {
                "slash": {"$ref": "#/$defs/a~1b"},
                "space": {"$ref": "#/$defs/c%20d"},
                "tilde": {"$ref": "#/$defs/t~0"},
                "first": {"$ref": "#/anyOf/1"},
            },
        }
        assert bundled(schema)["properties"] == {
            "slash": {"$ref": "#/$defs/a~1b"},
            "space": {"$ref": "#/$defs/c%20d"},
            "tilde": {"$ref": "#/$defs/t~0"},
            "first": {"$ref": "#/anyOf/1"},
        }

    def test_recursion_and_definitions(self) -> None:
        schema = {
            "definitions": {
                "node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/node"}}}
            },
            "$ref": "#/definitions/node",
            "$schema": "http://json-schema.org/draft-07/schema#",
        }
        assert bundled(schema) == {
            "definitions": {
                "node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/node"}}}
            },
            "$ref": "#/definitions/node",
        }


class TestRefused:
    def test_the_reported_payload(self) -> None:
        """A nested ``$id`` makes ``#/$defs/A`` a pointer into that resource, where there is none."""
        error = refusal(
            {
                "type": "object",
                "required": ["a"],
                "$defs": {"A": {"type": "string"}},
                "properties": {"a": {"$id": "http://127.0.0.1:18999/x/", "$ref": "#/$defs/A"}},
            }
        )
        assert error.param == PARAM + ".properties.a.$ref"
        assert "points at nothing" in str(error)

    @pytest.mark.parametrize(
        "reference",
        [
            "http://127.0.0.1:18999/schema.json",
            "https://example.com/schema.json#/$defs/A",
            "file:///etc/passwd",
            "urn:example:elsewhere",
            "other.json#/$defs/A",
            "//169.254.169.254/latest/meta-data",
        ],
    )
    def test_anything_outside_the_schema(self, reference: str) -> None:
        error = refusal({"properties": {"a": {"$ref": reference}}})
        assert error.param == PARAM + ".properties.a.$ref"
        assert "none is fetched" in str(error)

    @pytest.mark.parametrize(
        ("schema", "where", "words"),
        [
            ({"$defs": {}, "$ref": "#/$defs/missing"}, ".$ref", "points at nothing"),
            (
                {"$defs": {"A": {"enum": [{"type": "string"}]}}, "$ref": "#/$defs/A/enum/0"},
                ".$ref",
                "not a schema",
            ),
            ({"$ref": "#nowhere"}, ".$ref", "points at nothing"),
            ({"$ref": 7}, ".$ref", "must be a string"),
            ({"$id": ["x"]}, ".$id", "must be a string"),
            ({"$id": "#/defs"}, ".$id", "must not hold a JSON pointer"),
            ({"$anchor": "1st"}, ".$anchor", "must be a name"),
            (
                {"$defs": {"a": {"$id": "urn:x"}, "b": {"$id": "urn:x"}}},
                ".$defs.b.$id",
                "declares 'urn:x'",
            ),
            ({"$dynamicRef": "#meta"}, ".$dynamicRef", "cannot enforce"),
            ({"$dynamicAnchor": "meta"}, ".$dynamicAnchor", "cannot enforce"),
        ],
    )
    def test_what_does_not_resolve(self, schema, where, words) -> None:
        error = refusal(schema)
        assert error.param == PARAM + where
        assert words in str(error)
