"""The transport against hostile clients: HTTP/2 frames out of turn, held connections, WebSocket.

Each case runs on a real server process, under both entry points where both
apply (``bubo serve``, ``hypercorn bubo.app:app``), and ends by checking the
process is alive and ``/health`` answers.  Clients are raw sockets and the
``h2`` state machine, so the server sees exactly the frames written here.
"""

from __future__ import annotations

import base64
import json
import select
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import pytest

from .conftest import Server, bubo_command, free_port, hypercorn_command, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

KEY = "transport-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "http://app.example"
# Long enough for any answer on loopback; a wait that runs out is a failure, not a timing check.
WAIT_S = 20
CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16}


def assert_serving(server: Server) -> None:
    """The process is alive and a fresh client gets ``/health``."""
    assert server.process.poll() is None, f"the server exited:\n{server.output()[-3000:]}"
    response = httpx.get(f"{server.base_url}/health", headers=AUTH, timeout=WAIT_S)
    assert response.status_code == 200


def closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes the connection (True) or WAIT_S pass without it (False)."""
    sock.settimeout(WAIT_S)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def http1_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.x response with a Content-Length body, read from *sock*."""
    sock.settimeout(WAIT_S)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)
    }
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=WAIT_S)


class H2Client:
    """A cleartext HTTP/2 client over one socket, driven frame by frame."""

    def __init__(self, sock: socket.socket, connection: h2.connection.H2Connection) -> None:
        self.sock = sock
        self.connection = connection
        self.events: list[h2.events.Event] = []
        self.eof = False

    @classmethod
    def prior_knowledge(cls, server: Server) -> H2Client:
        client = cls(connect(server), _h2_connection())
        client.connection.initiate_connection()
        client.flush()
        return client

    @classmethod
    def upgrade(cls, server: Server, path: str) -> H2Client:
        """``Upgrade: h2c`` on a GET of *path*; the answer to it comes on stream 1."""
        connection = _h2_connection()
        settings = connection.initiate_upgrade_connection()  # the HTTP2-Settings value, base64url
        sock = connect(server)
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n".encode()
            + b"HTTP2-Settings: "
            + settings
            + b"\r\n\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed during the upgrade: {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        client = cls(sock, connection)
        client.flush()
        client.events.extend(connection.receive_data(rest))
        return client

    def flush(self) -> None:
        if data := self.connection.data_to_send():
            self.sock.sendall(data)

    def request(self, stream_id: int, method: str, path: str, *, end_stream: bool, **headers: str) -> None:
        pseudo = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")]
        self.connection.send_headers(stream_id, pseudo + list(headers.items()), end_stream=end_stream)
        self.flush()

    def data(self, stream_id: int, payload: bytes, *, end_stream: bool) -> None:
        self.connection.send_data(stream_id, payload, end_stream=end_stream)
        self.flush()

    def reset(self, stream_id: int) -> None:
        self.connection.reset_stream(stream_id)
        self.flush()

    def read_until(self, done: Callable[[list[h2.events.Event]], bool]) -> bool:
        """Take frames until *done* holds (True) or the server closes the connection (False)."""
        self.sock.settimeout(WAIT_S)
        while not done(self.events):
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                return False
            self.events.extend(self.connection.receive_data(data))
            self.flush()
        return True

    def round_trip(self, stream_id: int) -> None:
        """A whole ``GET /health`` on *stream_id*: by its end the app is done with what it answered before."""
        self.request(stream_id, "GET", "/health", end_stream=True, authorization=f"Bearer {KEY}")
        assert self.read_until(ended(stream_id)), "the server closed the connection"

    def close(self) -> None:
        self.sock.close()


def _h2_connection() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))


def answered(stream_id: int) -> Callable[[list[h2.events.Event]], bool]:
    return lambda events: any(
        isinstance(e, h2.events.ResponseReceived) and e.stream_id == stream_id for e in events
    )


def ended(stream_id: int) -> Callable[[list[h2.events.Event]], bool]:
    return lambda events: any(
        isinstance(e, h2.events.StreamEnded) and e.stream_id == stream_id for e in events
    )


def status_of(client: H2Client, stream_id: int) -> int:
    response = next(
        e for e in client.events if isinstance(e, h2.events.ResponseReceived) and e.stream_id == stream_id
    )
    return int(dict(response.headers)[":status"])


def _bubo_serve(port: int, *flags: str) -> list[str]:
    return [bubo_command(), "serve", "--port", str(port), *flags]


ENTRY_POINTS = {
    "bubo-serve": lambda port: _bubo_serve(port, "--keep-alive-timeout", "1"),
    "hypercorn": lambda port: [*hypercorn_command(port), "--keep-alive", "1"],
}


@pytest.fixture(name="served", scope="module", params=sorted(ENTRY_POINTS))
def _served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with an API key and CORS (the preflight needs no key), idle connections closed after 1 s."""
    port = free_port()
    server = start_server(
        ENTRY_POINTS[request.param](port),
        port,
        tmp_path_factory.mktemp("transport") / f"{request.param}.log",
        env={"BUBO_API_KEY": KEY, "BUBO_CORS_ORIGINS": ORIGIN},
        api_key=KEY,
    )
    yield server
    stop_server(server)


class TestHTTP2:
    """Frames Hypercorn once answered by exiting (its KeyError on a stream it had forgotten)."""

    def test_data_after_health_was_answered(self, served: Server) -> None:
        client = H2Client.prior_knowledge(served)
        client.request(1, "GET", "/health", end_stream=False, authorization=f"Bearer {KEY}")
        assert client.read_until(answered(1))
        client.round_trip(3)
        client.data(1, b"late", end_stream=True)
        assert client.read_until(ended(1)), "the server closed the connection"
        assert status_of(client, 1) == 200
        client.close()
        assert_serving(served)

    def test_data_after_cors_preflight_was_answered(self, served: Server) -> None:
        """The preflight needs no API key, so any client can send it."""
        client = H2Client.prior_knowledge(served)
        preflight = {"origin": ORIGIN, "access-control-request-method": "POST"}
        client.request(1, "OPTIONS", "/v1/chat/completions", end_stream=False, **preflight)
        assert client.read_until(answered(1))
        client.round_trip(3)
        client.data(1, b"late", end_stream=True)
        assert client.read_until(ended(1)), "the server closed the connection"
        client.close()
        assert_serving(served)

    def test_upgrade_from_http1_then_late_data(self, served: Server) -> None:
        client = H2Client.upgrade(served, "/health")
        assert client.read_until(ended(1))
        client.request(3, "GET", "/v1/models", end_stream=False, authorization=f"Bearer {KEY}")
        assert client.read_until(answered(3))
        client.round_trip(5)
        client.data(3, b"late", end_stream=True)
        assert client.read_until(ended(3)), "the server closed the connection"
        client.close()
        assert_serving(served)

    def test_streams_reset_while_others_run(self, served: Server) -> None:
        """A generation streams on stream 1 while 60 others open, send late, and reset."""
        client = H2Client.prior_knowledge(served)
        chat = json.dumps({**CHAT, "stream": True}).encode()
        json_headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
        client.request(1, "POST", "/v1/chat/completions", end_stream=False, **json_headers)
        client.data(1, chat, end_stream=True)
        for n in range(60):
            stream_id = 3 + 2 * n
            match n % 3:
                case 0:  # answered at once, then a body arrives, then the client resets it
                    client.request(
                        stream_id, "GET", "/health", end_stream=False, authorization=f"Bearer {KEY}"
                    )
                    assert client.read_until(answered(stream_id))
                    client.data(stream_id, b"{}", end_stream=False)
                case 1:  # reset before its body
                    client.request(
                        stream_id, "POST", "/v1/chat/completions", end_stream=False, **json_headers
                    )
                case _:  # a running generation, reset
                    client.request(
                        stream_id, "POST", "/v1/chat/completions", end_stream=False, **json_headers
                    )
                    client.data(stream_id, chat, end_stream=True)
            client.reset(stream_id)
        assert client.read_until(ended(1)), "the server closed the connection"
        assert status_of(client, 1) == 200
        client.close()
        assert_serving(served)


class TestConnections:
    """Finished and idle connections are closed by the server."""

    def test_connection_close_is_honoured(self, served: Server) -> None:
        sock = connect(served)
        sock.sendall(
            f"GET /health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n".encode()
        )
        status, headers, _ = http1_response(sock)
        assert status == 200
        assert headers["connection"].lower() == "close"
        assert closed_by_server(sock)
        sock.close()
        assert_serving(served)

    def test_http_1_0_is_closed_after_the_response(self, served: Server) -> None:
        sock = connect(served)
        sock.sendall(f"GET /health HTTP/1.0\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        status, _, _ = http1_response(sock)
        assert status == 200
        assert closed_by_server(sock)
        sock.close()

    def test_idle_keep_alive_connection_is_closed(self, served: Server) -> None:
        """After a served request the keep-alive timer runs again (1 s here)."""
        sock = connect(served)
        request = f"GET /health HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
        for _ in range(2):  # the connection is reused, then left idle
            sock.sendall(request)
            assert http1_response(sock)[0] == 200
        assert closed_by_server(sock)
        sock.close()
        assert_serving(served)

    def test_websocket_upgrade_is_refused_plainly(self, served: Server) -> None:
        logged = len(served.output())
        sock = connect(served)
        key = base64.b64encode(b"0123456789abcdef").decode()
        sock.sendall(
            "GET /v1/realtime HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n".encode()
        )
        status, headers, body = http1_response(sock)
        sock.close()
        assert status == 400
        assert headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert error["code"] == "websocket_not_supported"
        assert error["type"] == "invalid_request_error"
        assert_serving(served)
        assert "Traceback" not in served.output()[logged:]


@pytest.fixture(name="capped", scope="module")
def _capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``bubo serve --max-connections 32`` with idle connections kept for a minute, one slot."""
    port = free_port()
    flags = ("--max-connections", "32", "--keep-alive-timeout", "60", "--parallel", "1")
    server = start_server(_bubo_serve(port, *flags), port, tmp_path_factory.mktemp("capped") / "capped.log")
    yield server
    stop_server(server)


def request_running(server: Server) -> socket.socket:
    """A connection whose request runs with its body in: a streamed /completion, its answer begun.

    With one slot, the first generates and the others wait for it; the client reads no further.  The
    end of text is ignored, so the first runs for the whole test: a generation that ended would leave
    its connection idle, a place a newcomer may take.
    """
    sock = connect(server)
    body = json.dumps(
        {"prompt": "Count to one thousand.", "n_predict": 4096, "ignore_eos": True, "stream": True}
    ).encode()
    sock.sendall(
        b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    sock.settimeout(WAIT_S)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return sock


def upload_begun(server: Server) -> socket.socket:
    """A connection whose request is in the app (100 Continue seen), its body never sent."""
    sock = connect(server)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
    )
    sock.settimeout(WAIT_S)
    assert sock.recv(65536).startswith(b"HTTP/1.1 100")
    return sock


def closed_among(socks: list[socket.socket], expected: int) -> list[socket.socket]:
    """Wait (at most WAIT_S) until *expected* of *socks* are closed by the server; return those closed."""
    closed: list[socket.socket] = []
    waiting = list(socks)
    while len(closed) < expected:
        readable, _, _ = select.select(waiting, [], [], WAIT_S)
        if not readable:
            break
        for sock in readable:
            waiting.remove(sock)
            if closed_by_server(sock):
                closed.append(sock)
    readable, _, _ = select.select(waiting, [], [], 0)  # and no more than that
    return closed + [sock for sock in readable if closed_by_server(sock)]


class TestConnectionCap:
    def test_idle_connections_beyond_the_cap_make_room(self, capped: Server) -> None:
        """40 held connections, 32 allowed: idle ones are closed to make room, /health still answers."""
        held = [connect(capped) for _ in range(40)]
        try:
            assert_serving(capped)  # a 41st connection
            assert len(closed_among(held, 9)) == 9
        finally:
            for sock in held:
                sock.close()

    def test_uploads_that_never_end_make_room(self, capped: Server) -> None:
        """32 requests waiting for their bodies hold the cap: a newcomer takes the place of the first.

        (Connections an earlier test left may hold places too: then uploads make room for uploads,
        always the one begun first.)
        """
        uploads = [upload_begun(capped) for _ in range(32)]
        try:
            assert_serving(capped)  # a 33rd connection
            closed = closed_among(uploads, 1)
            assert set(closed) == set(uploads[: len(closed)])
        finally:
            for sock in uploads:
                sock.close()

    def test_excess_is_refused_when_every_connection_is_busy(self, capped: Server) -> None:
        busy = [request_running(capped) for _ in range(32)]
        try:
            with connect(capped) as refused:
                status, headers, body = http1_response(refused)
                assert status == 503
                assert headers["retry-after"] == "1"
                assert json.loads(body)["error"]["code"] == "too_many_connections"
                assert closed_by_server(refused)
        finally:
            for sock in busy:
                sock.close()
        assert_serving(capped)


def test_a_connection_failing_in_hypercorn_fails_alone(capped: Server) -> None:
    """``bubo serve`` only: a malformed ``HTTP2-Settings`` makes Hypercorn raise on that connection.

    Under ``hypercorn bubo.app:app`` this still ends the process (docs/operations.md).
    """
    logged = len(capped.output())
    sock = connect(capped)
    sock.sendall(
        b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: A\r\n\r\n"
    )
    assert closed_by_server(sock)
    sock.close()
    assert_serving(capped)
    assert "a connection failed in the HTTP layer and was closed" in capped.output()[logged:]


def test_health_answers_when_clients_hold_more_connections_than_descriptors(tmp_path: Path) -> None:
    """The issue's load, scaled to a 256-descriptor process: 320 clients hold their sockets.

    260 sent ``GET /health`` with ``Connection: close`` and read nothing more; 60 sent
    nothing.  Bubo must close the first, make room among the second, and keep answering.
    """
    port = free_port()
    limited = ["sh", "-c", 'ulimit -n 256 && exec "$0" "$@"', *_bubo_serve(port)]
    server = start_server(limited, port, tmp_path / "limited.log")
    held: list[socket.socket] = []
    try:
        for n in range(320):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                break  # the listen backlog is full: the server stopped accepting
            held.append(sock)
            if n < 260:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert_serving(server)
    finally:
        for sock in held:
            sock.close()
        stop_server(server)
