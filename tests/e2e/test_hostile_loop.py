"""/health through hostile load on one `bubo serve` (issue 36 §3): huge bodies, many slow uploads.

Each case reads /health's latency on a fresh connection before the attack and
throughout it, within one run, and holds the worst during the attack to the
issue's "never waits more than a second", or ten times the worst before where
this machine was slower than that already.  Counts and waits are bounded; the
server is stopped by PID.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

CAP = 48  # --max-connections here: the 1,000, scaled to a test
UPLOADS = 4 * CAP  # slow uploads one client opens, most beyond the cap
WAIT_S = 60  # a bound on a wait that should end far sooner (a hang guard, not a timing check)
POLLS = 10  # /health reads of the latency before
MAX_DURING_POLLS = 2000  # /health reads while a body is read, at most
BODY_BYTES = 16 * 1024 * 1024  # huge but allowed (--max-body-mib 32)
CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}


@pytest.fixture(name="server", scope="module")
def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``bubo serve`` with a small connection cap and ``--slot-save-path`` (so ``/slots`` reads bodies)."""
    port = free_port()
    folder = tmp_path_factory.mktemp("hostile-loop")
    (folder / "slots").mkdir()
    command = [
        bubo_command(), "serve", "--port", str(port), "--max-connections", str(CAP),
        "--keep-alive-timeout", "60", "--slot-save-path", str(folder / "slots"),
    ]  # fmt: skip
    server = start_server(command, port, folder / "serve.log")
    yield server
    stop_server(server)


def health_seconds(server: Server) -> float:
    """One GET /health on a new connection (as a monitor sends it): its time, once it answered 200."""
    started = time.perf_counter()
    response = httpx.get(f"{server.base_url}/health", timeout=WAIT_S)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed


def usual_bound(server: Server) -> float:
    """What /health may take during an attack: a second, or ten times its worst before, if that is more."""
    before = max(health_seconds(server) for _ in range(POLLS))
    return max(1.0, 10 * before)


def lora_body() -> bytes:
    """A JSON array of LoRA scales, BODY_BYTES long (each number is parsed by Python, as the server does)."""
    entry = b'{"id":0,"scale":0.5},'
    return b"[" + entry * (BODY_BYTES // len(entry)) + b'{"id":0,"scale":0.5}]'


def slot_body() -> bytes:
    """A slot action's body: a filename and an unknown field of BODY_BYTES of numbers."""
    return b'{"filename":"none.bin","pad":[' + b"0.5," * (BODY_BYTES // 4) + b"0.5]}"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/lora-adapters", lora_body, id="lora-adapters"),
        pytest.param("/slots/0?action=restore", slot_body, id="slots"),
    ],
)
def test_health_answers_while_a_huge_body_is_parsed(
    server: Server, path: str, body: Callable[[], bytes]
) -> None:
    """/health keeps its time while the server parses a 16 MiB body; the body gets its answer (no 5xx)."""
    content = body()
    bound = usual_bound(server)
    statuses: list[int] = []
    done = threading.Event()

    def post() -> None:
        try:
            response = httpx.post(
                f"{server.base_url}{path}",
                content=content,
                headers={"Content-Type": "application/json"},
                timeout=WAIT_S,
            )
            statuses.append(response.status_code)
        finally:
            done.set()

    poster = threading.Thread(target=post)
    poster.start()
    during: list[float] = []
    try:
        while not done.is_set() and len(during) < MAX_DURING_POLLS:
            during.append(health_seconds(server))
    finally:
        poster.join(WAIT_S)
    assert len(statuses) == 1
    assert statuses[0] < 500
    assert len(during) >= 2, "the body was answered before /health was read twice: it must be larger"
    assert max(during) < bound, f"/health took {max(during):.3f} s during the parse (bound {bound:.3f} s)"


def slow_upload(server: Server) -> socket.socket:
    """A connection that sent its headers and one byte of a 1 MiB body, and sends no more."""
    sock = socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=WAIT_S)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1048576\r\n\r\n{"
    )
    return sock


def closed_by_server(socks: list[socket.socket]) -> list[socket.socket]:
    """Those of *socks* the server has closed by now (each read to its end)."""
    closed = []
    readable, _, _ = select.select(socks, [], [], 0)
    for sock in readable:
        sock.settimeout(WAIT_S)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        closed.append(sock)
    return closed


def test_health_and_a_chat_are_served_while_one_client_holds_slow_uploads(server: Server) -> None:
    """One client opens four times --max-connections slow uploads; /health and a chat still get in.

    Each /health and the chat take the place of the upload begun first; so do the uploads beyond the
    cap.  Before issue 36, every newcomer at the cap was refused with 503.
    """
    bound = usual_bound(server)
    uploads: list[socket.socket] = []
    during: list[float] = []
    try:
        for n in range(UPLOADS):
            uploads.append(slow_upload(server))
            if n % 8 == 7:
                during.append(health_seconds(server))
        chat = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=WAIT_S)
        during.append(health_seconds(server))
        assert chat.status_code == 200, chat.text
        assert json.loads(chat.text)["choices"][0]["message"]["content"] is not None
        closed: set[socket.socket] = set()
        deadline = time.monotonic() + WAIT_S
        while len(closed) < UPLOADS - CAP and time.monotonic() < deadline:  # the cap holds: so many went
            closed.update(closed_by_server([sock for sock in uploads if sock not in closed]))
            time.sleep(0.05)
    finally:
        for sock in uploads:
            sock.close()
    assert len(closed) >= UPLOADS - CAP
    assert max(during) < bound, f"/health took {max(during):.3f} s during the uploads (bound {bound:.3f} s)"


def test_the_log_has_no_traceback(server: Server) -> None:
    """None of the cases above failed inside the server."""
    assert "Traceback" not in server.output()
