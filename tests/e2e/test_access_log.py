"""The access log through a real ``bubo serve`` of the default model: one line per request, whatever ended it.

A stream each dialect sends (OpenAI chat, Ollama chat) that the client closes
mid-way is one line with the status it began with, the ``X-Request-Id`` it
carried, and ``client_left``; ``/ready`` polled N times is N lines, each with a
status; a request that finished is one line without an outcome word.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

LINE = re.compile(
    r'(?P<client>\S+) "(?P<method>[A-Z]+) (?P<path>\S+) (?P<version>\S+)" (?P<status>\d{3}|-) (?P<bytes>\d+) '
    r"(?P<seconds>\d+\.\d{6})s request_id=(?P<id>\S+)(?: (?P<outcome>[a-z_]+))?$",
    re.MULTILINE,
)
LONG_ARRAY = {  # a schema the answer cannot end early under: hundreds of tokens before EOS is allowed
    "type": "object",
    "properties": {"numbers": {"type": "array", "items": {"type": "integer"}, "minItems": 400}},
    "required": ["numbers"],
}
CHAT = [{"role": "user", "content": "List numbers."}]
STREAMS = {
    "/v1/chat/completions": {
        "model": "bubo", "messages": CHAT, "stream": True, "max_tokens": 2000, "ignore_eos": True,
    },
    "/api/chat": {
        "model": "bubo", "messages": CHAT, "stream": True, "format": LONG_ARRAY, "options": {"num_predict": 2000},
    },
}  # fmt: skip


@pytest.fixture(name="served", scope="module")
def _served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("access-log") / "bubo.log"
    server = start_server([bubo_command(), "serve", "--port", str(port)], port, log)
    yield server
    assert stop_server(server) == 0
    # Every request the tests made, and the start-up's /ready polls, was logged once: no id twice.
    ids = [m["id"] for m in LINE.finditer(server.output())]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


def lines_for(server: Server, request_id: str) -> list[re.Match[str]]:
    """The access-log lines of *request_id*, once there is one (waiting at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        found = [m for m in LINE.finditer(server.output()) if m["id"] == request_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("path", list(STREAMS))
def test_a_stream_the_client_closed_is_one_line_with_its_status_id_and_client_left(
    served: Server, path: str
) -> None:
    with (
        httpx.Client(base_url=served.base_url, timeout=60) as client,
        client.stream("POST", path, json=STREAMS[path]) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        first = next(response.iter_bytes())
        assert first
    # the connection is closed with the stream still running
    (line,) = lines_for(served, request_id)
    assert (line["method"], line["path"], line["status"], line["outcome"]) == (
        "POST",
        path,
        "200",
        "client_left",
    )
    assert int(line["bytes"]) >= len(first)


def test_ready_polled_n_times_is_n_lines_each_with_its_status(served: Server) -> None:
    ids = []
    with httpx.Client(base_url=served.base_url, timeout=10) as client:
        for _ in range(12):
            response = client.get("/ready")
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
    assert len(set(ids)) == len(ids)
    for request_id in ids:
        (line,) = lines_for(served, request_id)
        assert (line["method"], line["path"], line["status"], line["outcome"]) == (
            "GET",
            "/ready",
            "200",
            None,
        )


def test_ready_polls_whose_client_hangs_up_at_once_are_one_line_each(served: Server) -> None:
    """A poller that closes its socket right after sending (a gateway's timed-out check): one line each.

    Hypercorn's own log wrote such a poll without a status, or twice.
    """
    host, port = served.base_url.removeprefix("http://").split(":")
    ids = [f"req-gone-{n}" for n in range(12)]
    for request_id in ids:
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(f"GET /ready HTTP/1.1\r\nHost: {host}\r\nX-Request-Id: {request_id}\r\n\r\n".encode())
    for request_id in ids:
        (line,) = lines_for(served, request_id)
        assert (line["method"], line["path"]) == ("GET", "/ready")
        # all of its answer went out before the server saw the client go; or the line says it left
        assert (line["status"], line["outcome"]) in {
            ("200", None),
            ("200", "client_left"),
            ("-", "client_left"),
        }


def test_a_finished_request_is_one_line_under_the_clients_own_id(served: Server) -> None:
    body = {"model": "bubo", "messages": CHAT, "max_tokens": 4}
    response = httpx.post(
        served.base_url + "/v1/chat/completions",
        json=body,
        headers={"X-Request-Id": "req-log-e2e-1"},
        timeout=60,
    )
    assert response.headers["x-request-id"] == "req-log-e2e-1"
    (line,) = lines_for(served, "req-log-e2e-1")
    assert (line["status"], line["outcome"], int(line["bytes"])) == ("200", None, len(response.content))
