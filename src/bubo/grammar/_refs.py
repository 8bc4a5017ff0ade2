"""References inside one request's JSON schema, resolved as Draft 2020-12 says, and never fetched.

A schema's ``$ref`` names a URI reference, resolved against the base URI of the
schema object holding it: the ``$id`` of the nearest enclosing resource (itself
resolved against its parent's base), else the document's own base.  The
fragment is a JSON pointer into that resource (``#/$defs/A``) or the name of an
``$anchor`` in it (``#node``); draft 7's ``"$id": "#node"`` is an anchor too.

Bubo resolves only inside the document it was sent: a reference to anything
else (``https://…``, ``file://…``, ``urn:…`` not declared by an ``$id`` of the
document) is refused with a 400 before the request queues, and nothing is ever
retrieved.  A resolved schema is *bundled*: every ``$ref`` is rewritten to a
JSON pointer from the document's root, and ``$id``, ``$anchor`` and
``$schema`` are dropped, so the grammar converter (which knows root pointers
only) and the answer's validator (:mod:`bubo.service.validation`) read the same
document the same way, with no base URI left to send them anywhere.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote, unquote, urldefrag, urljoin, urlsplit

import attrs

from bubo.errors import InvalidRequest

__all__ = ["DOCUMENT_URI", "Pointer", "References", "child_schemas", "pointer_text", "resolve_pointer"]

DOCUMENT_URI = "https://request-schema.invalid/"
"""The base URI of a document with no ``$id`` of its own (Draft 2020-12 §9.1.1: the retrieval URI).
``.invalid`` is reserved (RFC 2606): not even a mistaken fetch could reach a host."""

Pointer = tuple[str | int, ...]
"""A JSON pointer as its tokens: keys of objects, indexes of arrays."""

SCHEMA_MAPS = ("properties", "$defs", "definitions")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_DECLARATIONS = ("$id", "$anchor", "$schema")  # what a bundled schema no longer needs
_ANCHOR = re.compile(r"[A-Za-z_][-A-Za-z0-9._]*")  # Draft 2020-12 §8.2.2
_INDEX = re.compile(r"0|[1-9][0-9]*")


def child_schemas(schema: Mapping[str, Any]) -> Iterator[tuple[str, Pointer, Any]]:
    """Each schema directly inside *schema*: the keyword, the pointer's tokens below *schema*, the schema.

    The one list of where a schema holds schemas, read by the checks
    (:func:`bubo.grammar.check_schema`) and by the grammar converter's reference
    resolution.  Values of the wrong shape are skipped here: the checks refuse them.
    """
    for keyword, value in schema.items():
        if keyword in SCHEMA_MAPS and isinstance(value, Mapping):
            for name, child in value.items():
                yield keyword, (keyword, name), child
        elif keyword in SCHEMA_LISTS and isinstance(value, list):
            for index, child in enumerate(value):
                yield keyword, (keyword, index), child
        elif keyword == "items" or (keyword == "additionalProperties" and not isinstance(value, bool)):
            yield keyword, (keyword,), value


def pointer_text(pointer: Pointer) -> str:
    """``#/$defs/A``: *pointer* as a URI fragment (RFC 6901 escapes, then percent-encoding)."""
    tokens = (str(token).replace("~", "~0").replace("/", "~1") for token in pointer)
    return "#" + "".join("/" + quote(token, safe="$-._~!&'()*+,;=:@") for token in tokens)


def resolve_pointer(document: Any, fragment: str) -> tuple[Pointer, Any] | None:
    """The tokens and value a URI *fragment* (``/$defs/A``, percent-encoded) points at, else None."""
    if fragment and not fragment.startswith("/"):
        return None
    here, tokens = document, list[str | int]()
    for raw in unquote(fragment).split("/")[1:] if fragment else ():
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(here, Mapping) and token in here:
            tokens.append(token)
            here = here[token]
        elif isinstance(here, list) and _INDEX.fullmatch(token) and int(token) < len(here):
            tokens.append(int(token))
            here = here[int(token)]
        else:
            return None
    return tuple(tokens), here


def _join(base: str, reference: str) -> str:
    """*reference* resolved against *base* (RFC 3986), also where *base* is a URN."""
    if reference.startswith("#"):
        return urldefrag(base).url + reference
    if urlsplit(reference).scheme:
        return reference
    return urljoin(base, reference)


Refuse = Callable[[tuple[str, ...], str], InvalidRequest]


@attrs.define
class References:
    """What one schema document declares (resources, anchors) and refers to, gathered in one walk.

    :meth:`enter` is called for every schema of the document, parents first;
    :meth:`bundle` then resolves every reference and returns the bundled copy.
    """

    refuse: Refuse
    resources: dict[str, Pointer] = attrs.field(factory=lambda: {DOCUMENT_URI: ()})
    anchors: dict[str, Pointer] = attrs.field(factory=dict)
    schemas: set[Pointer] = attrs.field(factory=set)
    references: list[tuple[Pointer, tuple[str, ...], str, str]] = attrs.field(factory=list)
    declaring: list[Pointer] = attrs.field(factory=list)

    def enter(self, schema: Mapping[str, Any], pointer: Pointer, path: tuple[str, ...], base: str) -> str:
        """Note *schema*'s declarations and reference; the base URI its own subschemas resolve against.

        Raises:
            InvalidRequest: an ``$id``, ``$anchor`` or ``$ref`` that is not a usable string.

        """
        self.schemas.add(pointer)
        if any(keyword in schema for keyword in _DECLARATIONS):
            self.declaring.append(pointer)
        declared = schema.get("$id")
        if declared is not None:
            base = self._declare_id(declared, pointer, (*path, ".$id"), base)
        anchor = schema.get("$anchor")
        if anchor is not None:
            if not (isinstance(anchor, str) and _ANCHOR.fullmatch(anchor)):
                raise self.refuse(
                    (*path, ".$anchor"),
                    "must be a name (a letter or '_', then letters, digits, '-', '.', '_')",
                )
            self._declare_anchor(f"{base}#{anchor}", pointer, (*path, ".$anchor"))
        reference = schema.get("$ref")
        if reference is not None:
            if not isinstance(reference, str):
                raise self.refuse((*path, ".$ref"), "must be a string (a URI reference)")
            self.references.append((pointer, (*path, ".$ref"), reference, _join(base, reference)))
        return base

    def _declare_id(self, declared: Any, pointer: Pointer, path: tuple[str, ...], base: str) -> str:
        if not isinstance(declared, str):
            raise self.refuse(path, "must be a string (a URI reference)")
        uri, fragment = urldefrag(_join(base, declared))
        if fragment.startswith("/"):
            raise self.refuse(path, "must not hold a JSON pointer (Draft 2020-12 §8.2.1)")
        if uri and uri != urldefrag(base).url:
            if self.resources.get(uri, pointer) != pointer:
                raise self.refuse(
                    path, f"declares {uri!r}, which another schema of the document declares too"
                )
            self.resources[uri] = pointer
            base = uri
        if fragment:  # draft 7's plain-name fragment: an anchor
            self._declare_anchor(f"{urldefrag(base).url}#{fragment}", pointer, path)
        return base

    def _declare_anchor(self, uri: str, pointer: Pointer, path: tuple[str, ...]) -> None:
        if self.anchors.setdefault(uri, pointer) != pointer:
            raise self.refuse(path, f"declares the anchor {uri!r} a second time")

    def bundle(self, document: Any) -> Any:
        """*document* with every ``$ref`` a pointer from its root and no ``$id``/``$anchor``/``$schema``.

        The document itself is returned when it declares and refers to nothing.

        Raises:
            InvalidRequest: a reference does not resolve to a schema of the document.

        """
        if not self.references and not self.declaring:
            return document
        targets = [
            (holder, self._resolve(document, path, shown, uri))
            for holder, path, shown, uri in self.references
        ]
        bundled = copy.deepcopy(document)
        for pointer in self.declaring:
            node = _at(bundled, pointer)
            for keyword in _DECLARATIONS:
                node.pop(keyword, None)
        for holder, target in targets:
            _at(bundled, holder)["$ref"] = pointer_text(target)
        return bundled

    def _resolve(self, document: Any, path: tuple[str, ...], shown: str, uri: str) -> Pointer:
        resource_uri, fragment = urldefrag(uri)
        resource = self.resources.get(resource_uri)
        if resource is None:
            raise self.refuse(
                path, f"is {shown!r}, which names no part of this schema: only references inside the "
                "schema ($defs, definitions, an $id or $anchor of its own) are resolved, and none is fetched",
            )  # fmt: skip
        if fragment and not fragment.startswith("/"):
            target = self.anchors.get(f"{resource_uri}#{fragment}")
        else:
            found = resolve_pointer(_at(document, resource), fragment)
            target = None if found is None else (*resource, *found[0])
        if target is None:
            raise self.refuse(path, f"is {shown!r}, which points at nothing in this schema")
        if target not in self.schemas:
            raise self.refuse(path, f"is {shown!r}, which points at a value that is not a schema")
        return target


def _at(document: Any, pointer: Pointer) -> Any:
    for token in pointer:
        document = document[token]
    return document
