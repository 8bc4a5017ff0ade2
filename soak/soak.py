"""Soak: many clients against one real Bubo server on 127.0.0.1 for a bounded time.

    python soak/soak.py --minutes 10 --clients 8 --json soak.json

Starts ``bubo serve`` on a free loopback port (stopped by PID at the end), then
runs ``--clients`` concurrent clients that mix every dialect, streaming and
not, valid and invalid bodies, and leave at random moments (while queued,
during prefill, mid-stream).  After a warm-up it samples the server's resident
memory, threads and open file descriptors; at the end it checks:

- no 5xx except the documented 503 (``queue_full``, ``context_full``,
  ``insufficient_memory``, ``memory_pressure``) and 507;
- every 2xx body is well formed for its dialect (JSON objects of the right
  kind; SSE streams whose frames are JSON and that end the way the dialect ends);
- every 4xx has the route's error shape;
- ``/slots`` is idle and ``/metrics`` shows nothing processing or deferred;
- resident memory grew by less than ``--rss-growth-mib`` after the warm-up, and
  threads and file descriptors came back to their warm-up level.

Prints a JSON report (also written to ``--json``); exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

ALLOWED_5XX = {
    (503, "queue_full"), (503, "context_full"), (503, "insufficient_memory"), (503, "memory_pressure"),
    (507, None),
}  # fmt: skip
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
GENERATING = {"chat", "completions", "completion", "responses", "messages"}
HI = {"role": "user", "content": "hi"}
TOPICS = ["owls", "rivers", "bread", "the moon", "chess", "tea", "volcanoes", "bicycles", "maps", "rain"]


# ---------------------------------------------------------------- the server


@attrs.define
class ServerProcess:
    process: subprocess.Popen[bytes]
    base_url: str

    def proc(self, name: str) -> Path:
        return Path(f"/proc/{self.process.pid}/{name}")

    def rss_mib(self) -> float:
        for line in self.proc("status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def threads(self) -> int:
        for line in self.proc("status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise RuntimeError("no Threads")

    def fds(self) -> int:
        return sum(1 for _ in self.proc("fd").iterdir())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve(args: argparse.Namespace, log: Path) -> Iterator[ServerProcess]:
    """``bubo serve`` on 127.0.0.1, ready within 120 s; SIGTERM (then SIGKILL) by PID on exit."""
    port = _free_port()
    command = [
        sys.executable, "-m", "bubo", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--ctx-size", "2048", "--threads", str(args.threads), "--cache-ram", str(args.cache_ram_mib),
        "--max-queue", str(args.max_queue), "--max-body-mib", "1", "--parallel", str(args.parallel),
    ]  # fmt: skip
    with log.open("wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    server = ServerProcess(process, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited with {process.returncode}; see {log}")
            try:
                if httpx.get(f"{server.base_url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready within 120 s; see {log}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=45)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


# ---------------------------------------------------------------- what clients send


@attrs.frozen
class Call:
    """One request: where, what, whether it streams, and what a well-formed answer looks like."""

    name: str
    path: str
    body: Any  # JSON, or bytes sent as they are
    stream: bool = False
    valid: bool = True


def _messages(rng: random.Random) -> list[dict[str, Any]]:
    topic = rng.choice(TOPICS)
    turns = [{"role": "user", "content": f"Tell me one short fact about {topic}."}]
    if rng.random() < 0.5:  # an agent-style follow-up turn sharing the first turn's prefix
        turns += [
            {"role": "assistant", "content": f"Here is a fact about {topic}."},
            {"role": "user", "content": "And another one?"},
        ]
    return turns


def valid_call(rng: random.Random) -> Call:
    stream = rng.random() < 0.5
    n = rng.randint(4, 24)
    messages = _messages(rng)
    choices: list[Callable[[], Call]] = [
        lambda: Call("chat", "/v1/chat/completions", {
            "model": "bubo", "messages": messages, "max_tokens": n, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None,
        }, stream),
        lambda: Call("completions", "/v1/completions", {
            "model": "bubo", "prompt": messages[0]["content"], "max_tokens": n, "stream": stream,
        }, stream),
        lambda: Call("completion", "/completion", {
            "prompt": messages[0]["content"], "n_predict": n, "stream": stream,
        }, stream),
        lambda: Call("responses", "/v1/responses", {
            "model": "bubo", "input": messages, "max_output_tokens": n, "stream": stream, "store": False,
        }, stream),
        lambda: Call("messages", "/v1/messages", {
            "model": "bubo", "messages": messages, "max_tokens": n, "stream": stream,
        }, stream),
        lambda: Call("count_tokens", "/v1/messages/count_tokens", {"model": "bubo", "messages": messages}),
        lambda: Call("tokenize", "/tokenize", {"content": messages[0]["content"], "with_pieces": True}),
        lambda: Call("apply_template", "/apply-template", {"messages": messages}),
    ]  # fmt: skip
    return rng.choice(choices)()


def invalid_call(rng: random.Random) -> Call:
    bodies: list[tuple[str, Any]] = [
        ("/v1/chat/completions", {"model": "bubo", "messages": "not a list"}),
        ("/v1/chat/completions", {"model": "bubo", "messages": [HI], "max_tokens": -5}),
        ("/v1/chat/completions", {"model": "no-such-model", "messages": [HI]}),
        ("/v1/chat/completions", b"{not json"),
        ("/v1/completions", {"model": "bubo", "prompt": {"a": 1}}),
        ("/v1/responses", {"model": "bubo", "input": [{"role": "user", "content": 7}]}),
        ("/v1/messages", {"model": "bubo", "messages": [HI]}),  # no max_tokens
        ("/v1/messages/count_tokens", {"model": "bubo", "messages": [{"role": "user", "content": 5}]}),
        ("/completion", {"prompt": "hi", "n_predict": "many"}),
        ("/tokenize", {"content": ["a", None]}),
        ("/v1/chat/completions", b'{"model": "bubo", "messages": [' + b"1," * 600_000 + b"1]}"),  # 413
    ]  # fmt: skip
    path, body = rng.choice(bodies)
    return Call("invalid", path, body, valid=False)


# ---------------------------------------------------------------- checking answers


class Malformed(Exception):
    """A response that breaks its dialect's shape."""


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise Malformed(what)


def check_json(call: Call, payload: Any) -> None:
    _require(isinstance(payload, dict), "not a JSON object")
    match call.name:
        case "chat":
            _require(payload.get("object") == "chat.completion", "object")
            message = payload["choices"][0]["message"]
            _require(message["role"] == "assistant", "role")
            usage = payload["usage"]
            _require(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "usage")
        case "completions":
            _require(payload.get("object") == "text_completion", "object")
            _require(isinstance(payload["choices"][0]["text"], str), "text")
        case "completion":
            _require(isinstance(payload["content"], str), "content")
            _require(payload["stop"] is True, "stop")
        case "responses":
            _require(payload.get("object") == "response", "object")
            _require(payload["status"] in ("completed", "incomplete"), "status")
        case "messages":
            _require(payload.get("type") == "message", "type")
            _require(
                payload["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), "stop"
            )
        case "count_tokens":
            _require(isinstance(payload["input_tokens"], int) and payload["input_tokens"] > 0, "input_tokens")
        case "tokenize":
            _require(all(isinstance(t["id"], int) for t in payload["tokens"]), "tokens")
        case "apply_template":
            _require(isinstance(payload["prompt"], str) and payload["prompt"], "prompt")


def check_stream(call: Call, text: str) -> None:
    _require(text.endswith("\n\n"), "unterminated stream")
    events: list[tuple[str | None, Any]] = []
    for frame in text[:-2].split("\n\n"):
        lines = frame.split("\n")
        name = lines.pop(0)[len("event: ") :] if lines[0].startswith("event: ") else None
        _require(len(lines) == 1 and lines[0].startswith("data: "), f"frame {frame[:80]!r}")
        data = lines[0][len("data: ") :]
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    match call.name:
        case "chat" | "completions":
            _require(events[-1][1] == "[DONE]", "no [DONE]")
            _require(all(isinstance(d, dict) and "error" not in d for _, d in events[:-1]), "error frame")
        case "completion":
            _require(events[-1][1]["stop"] is True, "no final stop frame")
        case "responses":
            kinds = [d["type"] for _, d in events]
            _require(kinds[0] == "response.created", "first event")
            _require(kinds[-1] in ("response.completed", "response.incomplete"), "last event")
            numbers = [d["sequence_number"] for _, d in events]
            _require(numbers == list(range(len(numbers))), "sequence numbers")
        case "messages":
            kinds = [d["type"] for _, d in events]
            _require(kinds[0] == "message_start" and kinds[-1] == "message_stop", "event order")
            _require(all(name == d["type"] for name, d in events), "event names")


def check_error(call: Call, status: int, payload: Any) -> str:
    """The stable error code; raises Malformed when the body is not the route's error shape."""
    _require(isinstance(payload, dict), "error body not an object")
    if call.path in ANTHROPIC_ROUTES:
        _require(payload.get("type") == "error", "anthropic envelope")
        error = payload["error"]
    else:
        error = payload["error"]
    _require(bool(error.get("message")), "error message")
    code = error.get("code")
    _require(isinstance(code, str) and code != "", "error code")
    _require(status != 400 or call.valid is False, f"a valid request got 400 {code}")
    return str(code)


# ---------------------------------------------------------------- the clients


@attrs.define
class Tally:
    requests: int = 0
    disconnects: int = 0
    by_status: Counter[str] = attrs.field(factory=Counter)
    by_call: Counter[str] = attrs.field(factory=Counter)
    by_code: Counter[str] = attrs.field(factory=Counter)
    failures: list[str] = attrs.field(factory=list)

    def fail(self, message: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(message)


async def send(client: httpx.AsyncClient, call: Call, tally: Tally, leave_after: float | None) -> int | None:
    """Send *call*; with *leave_after*, the client goes away after that many seconds.

    Returns the status, or None when the client left.
    """
    tally.requests += 1
    tally.by_call[call.name] += 1
    content = call.body if isinstance(call.body, bytes) else json.dumps(call.body).encode()
    headers = {"Content-Type": "application/json"}
    with trio.move_on_after(leave_after if leave_after is not None else float("inf")) as scope:
        async with client.stream("POST", call.path, content=content, headers=headers) as response:
            body = b"".join([chunk async for chunk in response.aiter_bytes()])
    if scope.cancelled_caught:
        tally.disconnects += 1
        return None
    judge(call, response.status_code, response.headers.get("content-type", ""), body, tally)
    return response.status_code


def judge(call: Call, status: int, content_type: str, body: bytes, tally: Tally) -> None:
    tally.by_status[str(status)] += 1
    where = f"{call.name} {call.path} -> {status}"
    try:
        if status < 300:
            _require(call.valid, "an invalid request succeeded")
            if call.stream:
                _require(content_type.startswith("text/event-stream"), "content type")
                check_stream(call, body.decode())
            else:
                check_json(call, json.loads(body))
            return
        code = check_error(call, status, json.loads(body))
        tally.by_code[code] += 1
        documented = (status, code) in ALLOWED_5XX or (status, None) in ALLOWED_5XX
        _require(status < 500 or documented, f"undocumented {status} {code}")
    except (Malformed, KeyError, IndexError, TypeError, ValueError) as error:
        tally.fail(f"{where}: {type(error).__name__}: {error}: {body[:200]!r}")


async def client_loop(base_url: str, seed: int, deadline: float, tally: Tally, leave_ratio: float) -> None:
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=2)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        while trio.current_time() < deadline:
            call = invalid_call(rng) if rng.random() < 0.15 else valid_call(rng)
            generates = call.name in GENERATING and call.valid
            leave_after = rng.uniform(0.01, 1.0) if generates and rng.random() < leave_ratio else None
            try:
                status = await send(client, call, tally, leave_after)
            except httpx.HTTPError as error:
                tally.fail(f"{call.name} {call.path}: transport error {type(error).__name__}: {error}")
                status = None
            if status == 503:  # back off as a polite client would (Retry-After is 5 s; keep the load up)
                await trio.sleep(rng.uniform(0.2, 1.0))
            if rng.random() < 0.2:  # operations endpoints between requests
                for path in ("/health", "/metrics", "/slots"):
                    status = (await client.get(path)).status_code
                    if status != 200:
                        tally.fail(f"GET {path} -> {status}")


# ---------------------------------------------------------------- the run


@attrs.define
class Sample:
    rss_mib: float
    threads: int
    fds: int

    @classmethod
    def of(cls, server: ServerProcess) -> Sample:
        return cls(server.rss_mib(), server.threads(), server.fds())


async def settle(server: ServerProcess, baseline: Sample, seconds: float) -> tuple[Sample, dict[str, Any]]:
    """Wait (bounded) for the server to go idle and give back idle threads and sockets."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        deadline = trio.current_time() + seconds
        while True:
            slots = (await client.get("/slots")).json()
            metrics = (await client.get("/metrics")).text
            busy = any(s.get("is_processing") for s in slots) or _gauge(metrics, "requests_processing") > 0
            sample = Sample.of(server)
            settled = sample.threads <= baseline.threads and sample.fds <= baseline.fds
            if (not busy and settled) or trio.current_time() > deadline:
                deferred = _gauge(metrics, "requests_deferred")
                return sample, {"slots_idle": not busy, "requests_deferred": deferred}
            await trio.sleep(0.5)


def _gauge(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise ValueError(f"llamacpp:{name} not in /metrics")


async def soak(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    tally = Tally()
    seconds = args.minutes * 60
    warmup = min(max(10.0, seconds * 0.2), 120.0)
    start = trio.current_time()
    peak = 0.0
    warm: Sample | None = None
    async with trio.open_nursery() as nursery:
        for index in range(args.clients):
            nursery.start_soon(
                client_loop, server.base_url, args.seed + index, start + seconds, tally, args.leave
            )
        while trio.current_time() < start + seconds:
            await trio.sleep(1)
            peak = max(peak, server.rss_mib())
            if warm is None and trio.current_time() >= start + warmup:
                warm = Sample.of(server)
    assert warm is not None
    # threads and sockets of the load's last moments may take trio's idle-thread timeout (10 s) to go
    end, idle = await settle(server, warm, seconds=30)
    growth = end.rss_mib - warm.rss_mib
    checks = {
        "no_failures": not tally.failures,
        "slots_idle": idle["slots_idle"] and idle["requests_deferred"] == 0,
        "rss_growth_within_bound": growth < args.rss_growth_mib,
        "no_thread_leak": end.threads <= warm.threads,
        "no_fd_leak": end.fds <= warm.fds,
        "some_requests_succeeded": sum(n for s, n in tally.by_status.items() if s.startswith("2")) > 0,
    }
    return {
        "minutes": args.minutes,
        "clients": args.clients,
        "parallel": args.parallel,
        "requests": tally.requests,
        "disconnects": tally.disconnects,
        "by_status": dict(sorted(tally.by_status.items())),
        "by_call": dict(sorted(tally.by_call.items())),
        "error_codes": dict(sorted(tally.by_code.items())),
        "memory_mib": {
            "after_warmup": round(warm.rss_mib, 1),
            "end": round(end.rss_mib, 1),
            "peak": round(peak, 1),
            "growth": round(growth, 1),
            "bound": args.rss_growth_mib,
        },
        "threads": {"after_warmup": warm.threads, "end": end.threads},
        "fds": {"after_warmup": warm.fds, "end": end.fds},
        "checks": checks,
        "failures": tally.failures,
        "passed": all(checks.values()),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (10)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (8)")
    parser.add_argument(
        "--leave", type=float, default=0.15, help="share of generations the client leaves early (0.15)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed of the first client (1)")
    parser.add_argument("--threads", type=int, default=2, help="server threads (2)")
    parser.add_argument("--parallel", type=int, default=4, help="server slots, fewer than the clients (4)")
    parser.add_argument("--cache-ram-mib", type=int, default=64, help="server prompt-cache budget (64)")
    parser.add_argument(
        "--max-queue", type=int, default=4, help="server queue bound (4: some 503 queue_full)"
    )
    parser.add_argument(
        "--rss-growth-mib", type=float, default=96.0,
        help="allowed resident-memory growth after warm-up (96: the 64 MiB cache budget plus slack)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument(
        "--log", type=Path, default=Path("soak-server.log"), help="server log (soak-server.log)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with serve(args, args.log) as server:
        report = trio.run(soak, server, args)
        report["server_exit_status"] = None
    report["server_exit_status"] = server.process.returncode
    report["passed"] = report["passed"] and server.process.returncode == 0
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
