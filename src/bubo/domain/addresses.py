"""Network addresses: which ones reach this machine only, and the ``host[:port]`` a request names.

:func:`parse_authority` reads a ``Host`` header (or the part of an ``Origin``
after ``scheme://``) in one pass over at most :data:`MAX_AUTHORITY` characters,
with no regular expression: the text comes from any client.
"""

from __future__ import annotations

import ipaddress

import attrs

__all__ = ["MAX_AUTHORITY", "Authority", "is_loopback", "is_loopback_name", "parse_authority"]

MAX_AUTHORITY = 300
"""The longest ``host[:port]`` read: a DNS name has at most 253 characters, a bracketed IPv6 address 47."""

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-._")
_DIGITS = frozenset("0123456789")
_DOTTED_DIGITS = _DIGITS | {"."}


def is_loopback(host: str) -> bool:
    """Whether *host* (an address, possibly in ``[]``, or ``localhost``) is this machine only.

    An IPv4-mapped address counts as its IPv4 address: on a dual-stack ``::``
    socket an IPv4 loopback peer, or the local address it reached, reads
    ``::ffff:127.0.0.1``.
    """
    return host == "localhost" or _is_loopback_address(_address(host.strip("[]")))


@attrs.frozen
class Authority:
    """The ``host[:port]`` of a request: a lower-case name or an address (IPv6 without brackets)."""

    host: str
    port: int | None = None


def parse_authority(text: str) -> Authority | None:
    """*text* as ``name``, ``IPv4`` or ``[IPv6]``, each with an optional ``:port``; None when it is not one.

    Strict, as a browser writes it: ASCII letters, digits, ``-``, ``.`` and
    ``_`` in a name (no empty label; one trailing dot is dropped), a dotted
    quad or bracketed IPv6 address without a zone, a port of 1-5 digits up to
    65535.  A name made only of digits and dots must be a valid IPv4 address.
    """
    if not text or len(text) > MAX_AUTHORITY:
        return None
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or "%" in text[1:end]:
            return None
        try:
            address = ipaddress.IPv6Address(text[1:end])
        except ValueError:
            return None
        host: str | None = str(address)
        rest = text[end + 1 :]
    else:
        name, colon, port_text = text.partition(":")
        host, rest = _name(name.lower()), colon + port_text
    if host is None:
        return None
    if not rest:
        return Authority(host)
    port = _port(rest)
    return None if port is None else Authority(host, port)


def _port(text: str) -> int | None:
    """``:N`` as N (1-5 digits, at most 65535); None when it is not that."""
    digits = text[1:]
    if text[0] != ":" or not 1 <= len(digits) <= 5 or not _DIGITS.issuperset(digits) or int(digits) > 65535:
        return None
    return int(digits)


def _name(text: str) -> str | None:
    """A DNS name or dotted quad, lower case, without its trailing dot; None when it is neither."""
    name = text.removesuffix(".")
    if not name or not _NAME_CHARS.issuperset(name) or "" in name.split("."):
        return None
    if _DOTTED_DIGITS.issuperset(name):
        try:
            return str(ipaddress.IPv4Address(name))
        except ValueError:
            return None
    return name


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_loopback_name(host: str) -> bool:
    """Whether *host* (as :func:`parse_authority` gives it) can only mean this machine.

    ``localhost`` and the names under it (RFC 6761: browsers resolve them to
    loopback themselves, never asking DNS), ``127.x.x.x``, ``::1`` and the
    IPv4-mapped ``::ffff:127.x.x.x``.
    """
    if host == "localhost" or host.endswith(".localhost"):
        return True
    return _is_loopback_address(_address(host))


def _is_loopback_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback
