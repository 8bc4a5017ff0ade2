"""The browser boundary: what a web page in the user's browser may not make a local server do.

Two checks, decided from the request's headers alone (before its body is
read), with or without an API key (most local servers run keyless, and any
script of a front end's origin can read the key it keeps):

- **Host** (DNS rebinding).  A page on ``attacker.example`` that rebinds its
  name to 127.0.0.1 talks to the server as its own origin, so no ``Origin``
  check can tell; only the ``Host`` it sends names the attacker.  On a
  connection that reached a loopback address, only loopback names
  (``localhost`` and its subdomains, ``127.x.x.x``, ``[::1]``, any port) and
  the names of ``--allowed-hosts`` are served.  A server reached on another
  address was bound there by its operator, to be reached by name: the key and
  the ``Origin`` check guard it.
- **Origin** (cross-site requests: forms, ``fetch`` in ``no-cors`` mode,
  images).  A request whose ``Origin`` is neither the server's own (its
  ``scheme://host:port`` is the request's ``Host``), nor one ``--cors-origins``
  allows, nor one of Ollama's default allowed origins, is refused.  A
  cross-site request that carries no ``Origin`` (an ``<img>`` or a ``no-cors``
  ``GET``: browsers send none for those) is told by ``Sec-Fetch-Site:
  cross-site``: refused unless it is a top-level navigation (a link to the chat
  page) that changes nothing, whatever its method otherwise.

Programs that are not browsers send neither ``Origin`` nor ``Sec-Fetch-Site``
and talk to ``localhost`` or an address, so they pass both.  Every header is
read by :func:`bubo.domain.addresses.parse_authority` and plain string tests,
in time linear in its length.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

import attrs

from bubo.domain.addresses import Authority, is_loopback, is_loopback_name, parse_authority
from bubo.errors import BrowserRefused

__all__ = [
    "DEFAULT_ORIGIN_HOSTS",
    "DEFAULT_ORIGIN_SCHEMES",
    "SAFE_METHODS",
    "BrowserBoundary",
    "Origin",
    "parse_origin",
]

DEFAULT_ORIGIN_HOSTS = frozenset({"localhost", "127.0.0.1", "0.0.0.0"})  # noqa: S104 - an origin, not a bind
"""Pages on these hosts (``http`` or ``https``, any port) are allowed by default: Ollama's
``envconfig.AllowedOrigins``."""
DEFAULT_ORIGIN_SCHEMES = frozenset(
    {
        # Ollama's envconfig.AllowedOrigins: desktop and editor front ends
        "app",
        "file",
        "tauri",
        "vscode-webview",
        "vscode-file",
        # the browser extensions gin-contrib/cors admits with AllowBrowserExtensions (as Ollama sets it)
        "chrome-extension",
        "safari-extension",
        "moz-extension",
        "ms-browser-extension",
    }
)
"""Every origin of these schemes is allowed by default."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: a cross-site navigation with one of them (a link to the chat page) passes."""

_WEB_SCHEMES = {"http": 80, "https": 443}  # their default ports
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789+-.")
_SHOWN = 100  # characters of a refused header value quoted in the message


@attrs.frozen
class Origin:
    """An ``Origin`` header: ``null`` (an opaque origin), or a scheme with what follows ``://``."""

    scheme: str  # "null" for an opaque origin
    authority: Authority | None = None  # http(s) only
    rest: str = ""  # after "://", lower case

    @property
    def port(self) -> int | None:
        """The port a web origin's server listens on, the scheme's default when the origin names none."""
        if self.authority is None:
            return None
        return self.authority.port or _WEB_SCHEMES[self.scheme]


def parse_origin(text: str) -> Origin | None:
    """*text* as an ``Origin`` value (RFC 6454); None when it is not one."""
    if text == "null":
        return Origin("null")
    scheme, separator, rest = text.lower().partition("://")
    if not separator or not scheme or not _SCHEME_CHARS.issuperset(scheme):
        return None
    if scheme not in _WEB_SCHEMES:
        return Origin(scheme, rest=rest)
    authority = parse_authority(rest)
    return None if authority is None else Origin(scheme, authority, rest)


@attrs.frozen(kw_only=True)
class BrowserBoundary:
    """The two checks, with what the operator allowed (``--allowed-hosts``, ``--cors-origins``)."""

    allowed_hosts: tuple[str, ...] = ()  # names, addresses; ".example.com": it and its subdomains
    any_host: bool = False  # --allowed-hosts *: no Host check
    cors_origins: frozenset[str] = frozenset()  # scheme://host[:port], lower case
    any_origin: bool = False  # --cors-origins *: every origin, null included
    loopback_origins: bool = False  # --cors-origins localhost: http(s) on localhost, 127.x.x.x, [::1]

    def refuse_host(self, hosts: Sequence[str], server: Any) -> BrowserRefused | None:
        """Why a request with these ``Host`` values, on ASGI's *server* ``(host, port)``, is refused; or None.

        Only a connection that reached a loopback address is checked.  No
        ``Host``, or an empty one (HTTP/1.0 without it reaches the app so), is
        served: a browser always sends the name it used.
        """
        if self.any_host or not server or not is_loopback(str(server[0])) or list(hosts) in ([], [""]):
            return None
        authority = parse_authority(hosts[0]) if len(hosts) == 1 else None
        if authority is None:
            return BrowserRefused(
                f"the Host header {_quoted(hosts)} is not a valid host", code="host_not_allowed"
            )
        if is_loopback_name(authority.host) or self._allows_host(authority.host):
            return None
        shown = f"[{authority.host}]" if ":" in authority.host else authority.host
        return BrowserRefused(
            f"this server listens on a loopback address and serves only localhost, 127.x.x.x, [::1] and the "
            f"names of --allowed-hosts; {shown!r} is another name (a page that rebinds its DNS name to this "
            f"machine sends it): start the server with --allowed-hosts {shown} to serve it",
            code="host_not_allowed",
        )

    def refuse_origin(
        self,
        *,
        origins: Sequence[str],
        host: str | None,
        method: str,
        fetch_site: str | None = None,
        fetch_mode: str | None = None,
        fetch_dest: str | None = None,
    ) -> BrowserRefused | None:
        """Why a request from these ``Origin`` values, for *host*, is refused; or None.

        *fetch_site*, *fetch_mode* and *fetch_dest* are the ``Sec-Fetch-Site``,
        ``Sec-Fetch-Mode`` and ``Sec-Fetch-Dest`` headers: a request marked
        ``cross-site`` without an ``Origin`` is refused unless it is a top-level
        navigation (a link followed: mode ``navigate``, destination ``document``)
        with a safe method.  A frame's navigation (destination ``iframe``) or a
        ``<form method=GET>`` in one is refused like any other cross-site request.
        """
        if not origins:
            navigation = fetch_mode == "navigate" and fetch_dest == "document" and method in SAFE_METHODS
            if fetch_site == "cross-site" and not navigation:
                return BrowserRefused(
                    f"a {method} from another site (Sec-Fetch-Site: cross-site) that is not a link followed "
                    "and carries no allowed Origin may not reach this server (--cors-origins allows origins)",
                    code="origin_not_allowed",
                )
            return None
        origin = parse_origin(origins[0]) if len(origins) == 1 else None
        if origin is not None and (self._is_own(origin, host) or self._allows_origin(origin)):
            return None
        if origin is not None and origin.scheme == "null":
            return BrowserRefused(
                "a page with an opaque origin (Origin: null: a sandboxed frame, a file or data: page, a "
                "redirect across sites) may not call this server; serve the page from this server, or from "
                "an origin --cors-origins allows",
                code="origin_not_allowed",
            )
        return BrowserRefused(
            f"a web page on {_quoted(origins)} may not call this server: it is not the server's own origin, "
            "nor one of the default allowed origins, nor allowed by --cors-origins (start the server with "
            "--cors-origins ORIGIN to allow it)",
            code="origin_not_allowed",
        )

    def _allows_host(self, host: str) -> bool:
        return any(
            host == allowed or (allowed.startswith(".") and (host == allowed[1:] or host.endswith(allowed)))
            for allowed in self.allowed_hosts
        )

    @staticmethod
    def _is_own(origin: Origin, host: str | None) -> bool:
        """Whether *origin* is the server's own: its host and port are the request's ``Host``."""
        authority = parse_authority(host) if host else None
        if origin.authority is None or authority is None:
            return False
        return origin.authority.host == authority.host and origin.port == (
            authority.port or _WEB_SCHEMES[origin.scheme]
        )

    def _allows_origin(self, origin: Origin) -> bool:
        if self.any_origin or origin.scheme in DEFAULT_ORIGIN_SCHEMES:
            return True
        if origin.authority is None:
            return False
        if origin.authority.host in DEFAULT_ORIGIN_HOSTS:
            return True
        if self.loopback_origins and _is_loopback_origin_host(origin.authority.host):
            return True
        return f"{origin.scheme}://{origin.rest}" in self.cors_origins


def _is_loopback_origin_host(host: str) -> bool:
    """``localhost``, ``127.x.x.x`` or ``::1``: what ``--cors-origins localhost`` allows (llama-server's)."""
    if host in ("localhost", "::1"):
        return True
    try:
        return ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        return False


def _quoted(values: Sequence[str]) -> str:
    """Header values as a message quotes them: escaped, and cut short."""
    return ", ".join(repr(value[:_SHOWN]) for value in values)
