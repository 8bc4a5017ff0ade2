"""Older and shorthand forms of a JSON schema, written one way for the checks, the grammar and the validator.

Clients send schemas written for several drafts, and llama-server takes them:

- a boolean schema ``true`` admits anything: it is ``{}``;
- ``items: true`` and ``items: {}`` admit any item: the keyword says nothing and is dropped (the
  grammar converter fails on an empty ``items``, which it reads as "absent" and then looks for
  ``prefixItems``);
- ``items: false`` admits no item beyond ``prefixItems``: without ``prefixItems`` it is the empty tuple
  (``prefixItems: []`` and ``maxItems: 0``);
- ``items: [A, B]`` (drafts 4 to 2019-09: a tuple) is Draft 2020-12's ``prefixItems: [A, B]``, which
  the grammar writes as exactly those items, as llama.cpp's converter does.

``false`` anywhere else admits nothing, so no answer could be generated: it stays, and the checks refuse
it.  The pass is iterative, like the checks (:mod:`.schema`), so no nesting depth can overflow it; the
schema it was given is never changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._refs import SCHEMA_LISTS, SCHEMA_MAPS

__all__ = ["normal_form"]


def normal_form(schema: Any) -> Any:
    """*schema* with every subschema in its Draft 2020-12 form (schemas copied, other values shared)."""
    root = _one(schema)
    pending = [root]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        for keyword, value in list(node.items()):
            if keyword in SCHEMA_MAPS and isinstance(value, Mapping):
                children = {name: _one(child) for name, child in value.items()}
                node[keyword] = children
                pending.extend(children.values())
            elif keyword in SCHEMA_LISTS and isinstance(value, list):
                node[keyword] = [_one(child) for child in value]
                pending.extend(node[keyword])
            elif keyword == "items" or (keyword == "additionalProperties" and not isinstance(value, bool)):
                node[keyword] = _one(value)
                pending.append(node[keyword])
    return root


def _one(schema: Any) -> Any:
    """One schema in its 2020-12 form, its children not yet visited: a new dict, or the value as given."""
    if schema is True:
        return {}
    if not isinstance(schema, Mapping):
        return schema  # false, or not a schema at all: the checks refuse it at its path
    node = dict(schema)
    if "items" not in node:
        return node
    items = node["items"]
    if items is True or (isinstance(items, Mapping) and not items):
        del node["items"]
    elif items is False:
        del node["items"]
        if "prefixItems" not in node:  # the empty tuple, which the grammar writes as "[]"
            node["prefixItems"] = []
            node["maxItems"] = 0
    elif isinstance(items, list) and "prefixItems" not in node:
        node["prefixItems"] = node.pop("items")
    return node
