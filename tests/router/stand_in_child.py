"""A stand-in for a model's child ``bubo serve``: the router's side of the contract, without a model.

Run as ``python stand_in_child.py --port N --served-model-name NAME [...]``, with
the listening socket the router bound (on port N) in ``BUBO_ROUTER_LISTEN_FD``.  It
answers ``/ready`` and ``/v1/models``, requires ``BUBO_API_KEY``, echoes every
other request as JSON, and on request streams (server-sent events, or NDJSON
under ``/api/``; waiting for a gate file, noting when its client leaves) or dies (exit status 3) before or while it answers, between
events or in the middle of one.
On SIGTERM it stops accepting and exits once its answers in progress are done.
A model whose name starts with ``broken`` exits with status 3 at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DIE_STATUS = 3
GATE_WAIT_S = 30.0


def _arg(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


NAME = _arg("--served-model-name")
KEY = os.environ["BUBO_API_KEY"]


class Server(ThreadingHTTPServer):
    """Counts the answers in progress (idle keep-alive connections do not count)."""

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, bind_and_activate: bool
    ) -> None:
        super().__init__(address, handler, bind_and_activate=bind_and_activate)
        self.active = 0
        self.answering = threading.Condition()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def handle_one_request(self) -> None:
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline:
            self.close_connection = True
            return
        with self.server.answering:
            self.server.active += 1
        try:
            if self.parse_request():
                getattr(self, f"do_{self.command}")()
                self.wfile.flush()
        finally:
            with self.server.answering:
                self.server.active -= 1
                self.server.answering.notify_all()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {KEY}":
            return True
        self._json(401, {"error": {"message": "wrong key", "code": "invalid_api_key"}})
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        url = urlsplit(self.path)
        if url.path == "/ready":
            self._json(200, {"status": "ready", "model": NAME})
        elif url.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": NAME, "context_length": 99}]})
        else:
            self._echo(None)

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if body.get("die") == "before":
            os._exit(DIE_STATUS)
        if body.get("stream"):
            self._stream(body)
        else:
            self._echo(body)

    def _echo(self, body: Any) -> None:
        url = urlsplit(self.path)
        self._json(
            200,
            {
                "model": NAME,
                "pid": os.getpid(),
                "path": url.path,
                "query": url.query,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
                "argv": sys.argv[1:],
            },
        )

    def _stream(self, body: dict[str, Any]) -> None:
        if self.path.startswith("/api/"):  # Ollama's NDJSON: one object a line
            self._ndjson(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(f'data: {{"model": "{NAME}", "n": 0}}\n\n'.encode())
        if body.get("die") == "during":
            os._exit(DIE_STATUS)
        if body.get("die") == "mid-event":
            self._chunk(b'data: {"n": ')
            os._exit(DIE_STATUS)
        gate = Path(body["gate"]) if "gate" in body else None
        deadline = time.monotonic() + GATE_WAIT_S
        while gate is not None and not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            for n in range(1, int(body.get("chunks", 3)) + 1):
                self._chunk(f'data: {{"n": {n}}}\n\n'.encode())
                time.sleep(float(body.get("pause", 0)))
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except OSError:  # the router closed the connection: its client left
            if "left" in body:
                Path(body["left"]).write_text("left")

    def _ndjson(self, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(f'{{"model": "{NAME}", "n": 0}}\n'.encode())
        if body.get("die") == "during":
            os._exit(DIE_STATUS)
        if body.get("die") == "mid-event":
            self._chunk(b'{"n": ')
            os._exit(DIE_STATUS)
        self._chunk(b'{"done": true}\n')
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def main() -> None:
    if NAME.startswith("broken"):
        raise SystemExit(DIE_STATUS)
    server = Server(("127.0.0.1", int(_arg("--port"))), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=int(os.environ["BUBO_ROUTER_LISTEN_FD"]))  # bound by the router
    server.server_address = server.socket.getsockname()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    with server.answering:  # on SIGTERM, answers in progress finish (as bubo serve drains)
        server.answering.wait_for(lambda: server.active == 0)


if __name__ == "__main__":
    main()
