"""What the Open WebUI session keeps: a trap for requests beyond 127.0.0.1, and the recorded requests as fixtures."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from agents.proxy import Exchange, LocalServer

# Headers that shape how Bubo answers; the rest (Host, Content-Length, aiohttp's Accept-Encoding) are the transport's.
KEPT_HEADERS = {"content-type", "accept", "user-agent"}
TASK = re.compile(r"^### Task:\s*\n(.+)$", re.MULTILINE)


class Trap(LocalServer):
    """An HTTP proxy on 127.0.0.1 that forwards nothing: it records each request (CONNECT too) and answers 502."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        trap = self

        class Handler(BaseHTTPRequestHandler):
            def _refuse(self) -> None:
                trap.attempts.append(f"{self.command} {self.path}")
                self.send_error(502, "open-webui must not leave 127.0.0.1 in this test")

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_CONNECT = _refuse  # noqa: N815 - http.server names

            def log_message(self, *_: object) -> None:
                return

        super().__init__(Handler, name="internet-trap")


def purpose(method: str, path: str, body: Any) -> str:
    """What Open WebUI sent a request for: its task's first line (title, tags, follow-ups), else the endpoint."""
    if not isinstance(body, dict) or "messages" not in body:
        return f"{method} {path}"
    messages = body.get("messages") or []
    last = messages[-1].get("content") if messages else None
    task = TASK.search(last) if isinstance(last, str) else None
    if task:
        return task.group(1).strip()
    return "chat with tools" if body.get("tools") else "chat"


def write_fixture(exchanges: list[Exchange], target: Path, version: str, temporary: Path) -> None:
    """Every POST with a JSON body and the first GET of each path, in order, the *temporary* folder
    (where Open WebUI keeps its data) written as ``/data``."""
    seen: set[str] = set()
    requests: list[dict[str, Any]] = []
    for exchange in exchanges:
        if exchange.method == "GET":
            if exchange.path in seen:
                continue
            seen.add(exchange.path)
            body = None
        else:
            body = json.loads(exchange.body.decode().replace(str(temporary), "/data"))
        requests.append(
            {
                "purpose": purpose(exchange.method, exchange.path, body),
                "status": exchange.status,
                "method": exchange.method,
                "path": exchange.path,
                "headers": {k.lower(): v for k, v in exchange.headers.items() if k.lower() in KEPT_HEADERS},
                "body": body,
            }
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fixture = {"open_webui": version, "requests": requests}
    target.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
