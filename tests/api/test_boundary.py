"""The browser boundary's decisions, without an app: Host and Origin parsing, and who is refused."""

from __future__ import annotations

import pytest
from tests._linear import assert_linear

from bubo.api._boundary import BrowserBoundary, Origin, parse_origin
from bubo.config import ConfigError, load_settings
from bubo.domain.addresses import Authority, is_loopback, is_loopback_name, parse_authority
from bubo.server import browser_boundary

LOOPBACK = ("127.0.0.1", 8080)
LAN = ("192.168.1.20", 8080)


class TestParseAuthority:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("localhost", Authority("localhost")),
            ("LocalHost:8080", Authority("localhost", 8080)),
            ("localhost.", Authority("localhost")),
            ("127.0.0.1:1", Authority("127.0.0.1", 1)),
            ("[::1]", Authority("::1")),
            ("[::1]:65535", Authority("::1", 65535)),
            ("[0:0:0:0:0:0:0:1]:80", Authority("::1", 80)),
            ("llm.example.com:443", Authority("llm.example.com", 443)),
            ("my_host-1.lan", Authority("my_host-1.lan")),
        ],
    )
    def test_valid(self, text: str, expected: Authority) -> None:
        """Names (lower case, one trailing dot dropped), dotted quads and bracketed IPv6, with a port."""
        assert parse_authority(text) == expected

    @pytest.mark.parametrize(
        "text",
        [
            "",
            ":8080",
            "localhost:",
            "localhost:65536",
            "localhost:123456",
            "localhost:80:80",
            "localhost:+80",
            "::1",
            "[::1",
            "[::1]x",
            "[::1]:",
            "[fe80::1%eth0]",
            "[127.0.0.1]",
            "a..b",
            ".localhost",
            "evil.example/x",
            "evil example",
            "éxample.com",
            "127.1",
            "256.0.0.1",
            "a" * 301,
        ],
    )
    def test_invalid(self, text: str) -> None:
        """Anything a browser would not write as a Host is not one."""
        assert parse_authority(text) is None

    def test_long_adversarial_shapes(self) -> None:
        """Colons, dots and brackets by the thousand are refused (by their length, before any search)."""
        for shape in (":" * 10_000, "[" + ":" * 10_000, "1." * 5_000, "a." * 5_000 + ":"):
            assert parse_authority(shape) is None

    @pytest.mark.parametrize(
        ("host", "loopback"),
        [
            ("localhost", True),
            ("app.localhost", True),
            ("127.0.0.1", True),
            ("127.255.3.4", True),
            ("::1", True),
            ("::ffff:7f00:1", True),
            ("localhost.evil.example", False),
            ("evil-localhost", False),
            ("0.0.0.0", False),
            ("192.168.1.20", False),
            ("::2", False),
        ],
    )
    def test_loopback_names(self, host: str, loopback: bool) -> None:
        """localhost and its subdomains, 127/8 and ::1 (also IPv4-mapped) mean this machine, nothing else."""
        assert is_loopback_name(host) is loopback

    @pytest.mark.parametrize(
        ("address", "loopback"),
        [
            ("127.0.0.1", True),
            ("::1", True),
            ("[::1]", True),
            ("::ffff:127.0.0.1", True),
            ("localhost", True),
            ("::ffff:192.168.1.20", False),
            ("0.0.0.0", False),
            ("::", False),
        ],
    )
    def test_loopback_addresses(self, address: str, loopback: bool) -> None:
        """A socket's address (a peer's, or the one it reached) is loopback as its IPv4 form is, if mapped."""
        assert is_loopback(address) is loopback


class TestParseOrigin:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("null", Origin("null")),
            ("http://localhost:5173", Origin("http", Authority("localhost", 5173), "localhost:5173")),
            ("HTTPS://Example.com", Origin("https", Authority("example.com"), "example.com")),
            ("vscode-webview://abc123", Origin("vscode-webview", rest="abc123")),
            ("chrome-extension://abcdef", Origin("chrome-extension", rest="abcdef")),
        ],
    )
    def test_valid(self, text: str, expected: Origin) -> None:
        """null, web origins with their host and port, and other schemes with what follows ://."""
        assert parse_origin(text) == expected

    @pytest.mark.parametrize(
        "text", ["", "localhost", "http//x", "://x", "http://", "http://a b", "ht tp://x"]
    )
    def test_invalid(self, text: str) -> None:
        """A value that is no origin is not parsed into one."""
        assert parse_origin(text) is None

    def test_default_port(self) -> None:
        """An origin without a port means its scheme's."""
        assert parse_origin("https://example.com").port == 443
        assert parse_origin("http://example.com").port == 80


class TestHostCheck:
    @pytest.mark.parametrize(
        "host",
        ["localhost", "localhost:8080", "127.0.0.1:8080", "127.0.0.2", "[::1]:8080", "app.localhost:3"],
    )
    def test_loopback_names_are_served(self, host: str) -> None:
        """On a loopback address, a loopback name or address with any port passes."""
        assert BrowserBoundary().refuse_host([host], LOOPBACK) is None

    @pytest.mark.parametrize(
        "host", ["rebind.test:8080", "evil.example", "192.168.1.20:8080", "localhost.evil.example"]
    )
    def test_other_names_are_refused_on_loopback(self, host: str) -> None:
        """Any other name, on a loopback address, is a 403 that names --allowed-hosts."""
        error = BrowserBoundary().refuse_host([host], LOOPBACK)
        assert error is not None
        assert (error.status, error.code) == (403, "host_not_allowed")
        assert "--allowed-hosts" in error.message

    def test_ipv6_loopback_address(self) -> None:
        """Hypercorn reports ::1 without brackets: it is loopback too."""
        assert BrowserBoundary().refuse_host(["rebind.test"], ("::1", 8080, 0, 0)) is not None

    def test_ipv4_loopback_on_a_dual_stack_socket(self) -> None:
        """On `--host ::` an IPv4 loopback connection reached ::ffff:127.0.0.1: it is checked as loopback."""
        assert BrowserBoundary().refuse_host(["rebind.test"], ("::ffff:127.0.0.1", 8080, 0, 0)) is not None

    def test_not_checked_on_other_addresses(self) -> None:
        """A server reached on a non-loopback address (or a Unix socket, or no address) serves any name."""
        boundary = BrowserBoundary()
        assert boundary.refuse_host(["llm.example.com"], LAN) is None
        assert boundary.refuse_host(["llm.example.com"], ("/run/bubo.sock", None)) is None
        assert boundary.refuse_host(["llm.example.com"], None) is None

    def test_allowed_hosts(self) -> None:
        """--allowed-hosts admits its names, at any port; a leading dot admits the subdomains too."""
        boundary = BrowserBoundary(allowed_hosts=("llm.example.com", ".lan"))
        for host in ("llm.example.com", "LLM.example.com:8443", "lan", "box.lan:80", "a.b.lan"):
            assert boundary.refuse_host([host], LOOPBACK) is None, host
        for host in ("example.com", "xllm.example.com", "evil-lan", "lan.evil"):
            assert boundary.refuse_host([host], LOOPBACK) is not None, host

    def test_any_host(self) -> None:
        """--allowed-hosts * turns the check off."""
        assert BrowserBoundary(any_host=True).refuse_host(["rebind.test"], LOOPBACK) is None

    def test_absent_host_is_served(self) -> None:
        """HTTP/1.0 without Host (Hypercorn gives it as empty): a browser always sends one, nothing is rebound."""
        assert BrowserBoundary().refuse_host([], LOOPBACK) is None
        assert BrowserBoundary().refuse_host([""], LOOPBACK) is None

    @pytest.mark.parametrize(
        "hosts", [["localhost", "rebind.test"], ["localhost", "localhost"], ["local host"]]
    )
    def test_ambiguous_or_invalid_host_is_refused(self, hosts: list[str]) -> None:
        """Two Host headers, or one that does not parse, are refused on loopback."""
        assert BrowserBoundary().refuse_host(hosts, LOOPBACK) is not None


def _origin(
    boundary: BrowserBoundary, origin: str | None, *, host: str = "127.0.0.1:8080", method: str = "POST"
):
    return boundary.refuse_origin(
        origins=[] if origin is None else [origin], host=host, method=method, fetch_site=None
    )


class TestOriginCheck:
    def test_no_origin_passes(self) -> None:
        """curl, SDKs and agents send no Origin."""
        assert _origin(BrowserBoundary(), None) is None

    @pytest.mark.parametrize(
        ("origin", "host"),
        [
            ("http://127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://[::1]:8080", "[::1]:8080"),
            ("https://llm.example.com", "llm.example.com"),
            ("https://llm.example.com", "llm.example.com:443"),
            ("http://llm.example.com", "LLM.example.com:80"),
        ],
    )
    def test_own_origin_passes(self, origin: str, host: str) -> None:
        """The chat page's own requests: its origin is the request's Host."""
        assert _origin(BrowserBoundary(), origin, host=host) is None

    @pytest.mark.parametrize(
        "origin",
        [
            "http://localhost",
            "https://localhost:3000",
            "http://127.0.0.1:5173",
            "http://0.0.0.0:8000",
            "app://-",
            "file://",
            "tauri://localhost",
            "vscode-webview://1a2b3c",
            "vscode-file://vscode-app",
            "chrome-extension://abcdefghijklmnop",
            "moz-extension://1234-5678",
            "safari-extension://x",
            "ms-browser-extension://x",
        ],
    )
    def test_ollamas_default_origins_pass(self, origin: str) -> None:
        """Ollama's default allowed origins (envconfig, gin-contrib/cors' browser extensions) pass."""
        assert _origin(BrowserBoundary(), origin) is None

    @pytest.mark.parametrize(
        "origin",
        [
            "http://evil.example",
            "http://127.0.0.1.evil.example",
            "http://127.0.0.2:8080",
            "http://[::1]:3000",
            "http://localhost.evil.example",
            "http://rebind.test:8080",
            "null",
            "javascript://x",
            "not an origin",
        ],
    )
    def test_other_origins_are_refused(self, origin: str) -> None:
        """Any other origin, null included, is a 403 that names --cors-origins."""
        error = _origin(BrowserBoundary(), origin)
        assert error is not None
        assert (error.status, error.code) == (403, "origin_not_allowed")
        assert "--cors-origins" in error.message

    @pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "POST", "DELETE"])
    def test_on_every_method(self, method: str) -> None:
        """GET too: a page must not read or trigger anything."""
        assert _origin(BrowserBoundary(), "http://evil.example", method=method) is not None

    def test_two_origins_are_refused(self) -> None:
        """Two Origin headers are ambiguous."""
        boundary = BrowserBoundary()
        refused = boundary.refuse_origin(
            origins=["http://localhost", "http://evil.example"],
            host="localhost",
            method="GET",
            fetch_site=None,
        )
        assert refused is not None

    def test_cors_origins(self) -> None:
        """--cors-origins' own origins pass, compared without case."""
        boundary = BrowserBoundary(cors_origins=frozenset({"https://app.example"}))
        assert _origin(boundary, "https://APP.example") is None
        assert _origin(boundary, "https://app.example:8443") is not None
        assert _origin(boundary, "http://app.example") is not None

    def test_cors_localhost(self) -> None:
        """--cors-origins localhost allows any loopback page, llama-server's meaning."""
        boundary = BrowserBoundary(loopback_origins=True)
        for origin in ("http://127.0.0.2:8080", "https://[::1]:3000", "http://localhost:1"):
            assert _origin(boundary, origin) is None, origin
        assert _origin(boundary, "http://localhost.evil.example") is not None

    def test_cors_any(self) -> None:
        """--cors-origins * allows every origin, null included."""
        boundary = BrowserBoundary(any_origin=True)
        assert _origin(boundary, "http://evil.example") is None
        assert _origin(boundary, "null") is None


class TestSecFetchSite:
    def _refuse(
        self,
        method: str,
        site: str | None,
        mode: str | None = None,
        origins: list[str] | None = None,
        dest: str | None = "document",
    ):
        return BrowserBoundary().refuse_origin(
            origins=origins or [],
            host="127.0.0.1:8080",
            method=method,
            fetch_site=site,
            fetch_mode=mode,
            fetch_dest=dest,
        )

    @pytest.mark.parametrize(
        ("method", "mode"),
        [
            ("POST", "navigate"),
            ("POST", "no-cors"),
            ("PUT", "cors"),
            ("DELETE", None),
            ("GET", "no-cors"),
            ("GET", None),
        ],
    )
    def test_cross_site_without_origin_is_refused(self, method: str, mode: str | None) -> None:
        """A form POST, an <img> or a no-cors GET from another site (no Origin on the last two) is refused."""
        error = self._refuse(method, "cross-site", mode)
        assert error is not None
        assert error.code == "origin_not_allowed"

    @pytest.mark.parametrize(
        ("method", "site", "mode"),
        [
            ("GET", "cross-site", "navigate"),
            ("HEAD", "cross-site", "navigate"),
            ("POST", "same-origin", "cors"),
            ("GET", "same-site", "no-cors"),
            ("POST", "none", "navigate"),
            ("POST", None, None),
        ],
    )
    def test_others_pass(self, method: str, site: str | None, mode: str | None) -> None:
        """A link followed from another site, same-site and same-origin requests, typed URLs pass."""
        assert self._refuse(method, site, mode) is None

    @pytest.mark.parametrize("dest", ["iframe", "frame", "embed", None])
    def test_a_navigation_inside_a_frame_is_refused(self, dest: str | None) -> None:
        """A hostile page's <iframe> (or a GET form aimed into one) navigates too, but not the top level."""
        assert self._refuse("GET", "cross-site", "navigate", dest=dest) is not None

    def test_cross_site_with_an_allowed_origin_passes(self) -> None:
        """An editor's webview is cross-site but allowed."""
        assert self._refuse("POST", "cross-site", "cors", ["vscode-webview://abc"]) is None


class TestFromSettings:
    def test_flags(self) -> None:
        """--allowed-hosts and --cors-origins become the boundary's lists."""
        settings = load_settings(
            {
                "server__allowed_hosts": "llm.example.com,.lan",
                "server__cors_origins": "https://App.example,localhost",
            },
            environ={},
        )
        boundary = browser_boundary(settings.server)
        assert boundary == BrowserBoundary(
            allowed_hosts=("llm.example.com", ".lan"),
            cors_origins=frozenset({"https://app.example"}),
            loopback_origins=True,
        )

    @pytest.mark.parametrize("text", ["llm.example.com:443", "http://llm.example.com", "a b", ".[::1]", ","])
    def test_bad_allowed_hosts(self, text: str) -> None:
        """A port, a URL, a space, a suffix on an address, or nothing: refused at start, naming the flag."""
        with pytest.raises(ConfigError, match="--allowed-hosts"):
            load_settings({"server__allowed_hosts": text}, environ={})

    def test_any(self) -> None:
        """* in either list turns that check off."""
        settings = load_settings({}, environ={"BUBO_ALLOWED_HOSTS": "*", "BUBO_CORS_ORIGINS": "*"})
        boundary = browser_boundary(settings.server)
        assert (boundary.any_host, boundary.any_origin) == (True, True)


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "a." * n + ":",  # labels, then a port that is not one
        lambda n: "a-" * n + ".b:8080",
        lambda n: "[" + "0:" * (n // 2) + "]",  # an IPv6 address that is not one
    ],
)
def test_parsing_time_grows_linearly(make) -> None:
    """Host and Origin values of n and 4n characters, under the 300 read at all: the work grows linearly."""

    def parse_many(text: str) -> None:
        for _ in range(2_000):
            parse_authority(text)
            parse_origin("http://" + text)

    assert_linear(make, parse_many, 35)
