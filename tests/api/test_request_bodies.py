"""The request converter's hooks are built at start-up, for every type a route structures.

A union that JSON cannot choose a member of is a programming error: it must stop ``import
bubo.server`` (``REQUEST_CONVERTER``), never reach a client as a 400.  cattrs builds a hook when it
first meets a type, so ``make_converter`` walks every type inside the bodies it is given, and each
dialect lists the types its routes structure (``REQUEST_BODIES``), which this test reads back from
the routes' own calls.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import attrs
import pytest

import bubo
from bubo.api._converter import make_converter, structure
from bubo.server import request_bodies

API = Path(bubo.__file__).parent / "api"
# the readers and the position of the type they structure as (run-time names in _context.py itself)
READERS = {"read_body": 1, "structured_body": 1, "structured_array": 1, "structure": 2}


@attrs.frozen
class Inner:
    a: int = 0


@attrs.frozen
class Ambiguous:
    """A JSON object could be the mapping or the class: no hook can choose."""

    x: dict[str, int] | Inner | None = None


@attrs.frozen
class Outer:
    inside: list[Ambiguous] | None = None


def test_a_union_json_cannot_choose_from_fails_as_the_converter_is_built() -> None:
    """Deep inside an optional list, where cattrs alone would build it at the first request that has one."""
    with pytest.raises(TypeError, match="several members take a JSON object"):
        make_converter((Outer,))


def test_a_converter_built_with_the_bodies_structures_them() -> None:
    converter = make_converter((Inner,))
    assert structure(converter, {"a": 2}, Inner) == Inner(a=2)


def structured_types() -> list[tuple[str, Any]]:
    """Each type a module of ``bubo.api`` hands a reader, evaluated in that module, with where."""
    found = []
    for path in sorted(API.rglob("*.py")):
        if path.name in {"_context.py", "_converter.py"}:
            continue  # the readers themselves
        module = importlib.import_module(
            ".".join(("bubo", *path.relative_to(API.parent).with_suffix("").parts))
        )
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "func", None) and getattr(node.func, "id", None)  # type: ignore[attr-defined]
            if name not in READERS:
                continue
            expression = ast.unparse(node.args[READERS[name]])  # type: ignore[attr-defined]
            model = eval(expression, vars(module))
            found.append((f"{path.name}:{node.lineno}", list[model] if name == "structured_array" else model))  # type: ignore[attr-defined]
    return found


def test_every_type_a_route_structures_is_built_at_start_up() -> None:
    found = structured_types()
    assert len(found) >= 20, (
        found
    )  # every dialect's routes, the tools of the Responses API: the scan finds them
    listed = set(request_bodies())
    assert [(where, model) for where, model in found if model not in listed] == []
