"""Coding agents run whole sessions on Bubo: Claude Code, Codex CLI and opencode (``nox -s agents``).

    python agents/run.py [--only claude,codex] [--timeout 600] [--record tests/fixtures/agents]
                         [--threads N] [--courier auto|on|off]

Installs the agents from the npm registry into a cache folder (``--cache``),
starts ``bubo serve`` with Qwen2.5-Coder-0.5B on a free loopback port, and runs
each agent once, offline and bounded, on a small task in a temporary git
repository, through a logging proxy (``proxy.py``).  It fails when a request
got a non-2xx status, when a stream carried an error after its 200, or when a
request re-read more than 10 % of the prompt prefix the previous request
already had (the prefix is measured on the prompts Bubo renders, ``prompts.py``;
the re-read is the part of it not served from the prompt cache).  The report
(``--report``, also printed) lists per request: endpoint, status, prompt and
cached tokens, the prefix shared with the previous request, the time to the
first byte and to the first token.  ``--record DIR`` writes the agents' first
requests, machine paths scrubbed, as the test fixtures the default test run
replays.

``--slow-prefill S`` runs the server through ``tests/e2e/harness_server.py``
with its ``prefill-delay`` switch: each prompt chunk (up to 2,048 tokens) waits
S seconds first, so a prompt is read for minutes on any machine.  The run then
also fails unless a request waited longer than ``--guard`` seconds (240, qwen-code's
default stream idle guard) for its first token and was still answered in full,
and when the agent left any request before its answer ended: the keep-alives
(counted per request in the report) must feed the agent's guard.  qwen-code
then runs one turn with a short system prompt and fewer tools (about 11,600
prompt tokens, not 17,400), and without its other guard, a 15-minute cap on a
stream's whole length (QWEN_STREAM_MAX_LIFETIME_MS): no keep-alive can feed
that one, and a prompt read slowly beside other work can outlast it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "agents")]

from clis import AGENTS, Agent, install  # noqa: E402 - the harness's own modules, by path
from prompts import PromptRenderer, shared_prefix  # noqa: E402
from proxy import Exchange, LoggingProxy  # noqa: E402
from tests._models import qwen25_coder_path  # noqa: E402

CONTEXT = 32768
REREAD_LIMIT = 0.10  # of the prefix the previous request had
MIN_PREFIX = 256  # shorter shared prefixes are not judged
TASK = "calc.py has a bug: add(2, 3) returns -1. Fix add() so that it returns the sum, then stop."
GENERATING = ("/v1/messages", "/v1/chat/completions", "/v1/responses")
GUARD_S = 240.0  # qwen-code's stream idle guard: no parsed chunk for this long and it drops the request
HARNESS = ROOT / "tests" / "e2e" / "harness_server.py"


@attrs.define
class AgentRun:
    """One agent's session and what it sent."""

    agent: Agent
    exchanges: list[Exchange]
    returncode: int | None  # None: stopped at the time limit
    seconds: float
    # exchange number -> tokens its prompt shares with the previous request's
    prefixes: dict[int, int] = attrs.Factory(dict)
    failures: list[str] = attrs.Factory(list)
    cache: dict[str, Any] = attrs.Factory(dict)  # /debug/cache after the session: live tokens, snapshots


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default=",".join(a.name for a in AGENTS), help="agents to run, by name")
    parser.add_argument("--timeout", type=float, default=600, help="seconds each agent may run (600)")
    parser.add_argument("--cache", type=Path, default=ROOT / ".nox" / "agents-cli", help="npm install folder")
    parser.add_argument("--report", type=Path, default=ROOT / ".nox" / "agents-report.md")
    parser.add_argument("--record", type=Path, help="write the first requests as fixtures here")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--courier", choices=("auto", "on", "off"), help="the server's --courier (default: its own)"
    )
    parser.add_argument("--slow-prefill", type=float, default=0.0, help="seconds each prompt chunk waits (0)")
    parser.add_argument("--guard", type=float, default=GUARD_S, help="with --slow-prefill: the idle guard, s")
    args = parser.parse_args()
    # a SIGTERM (nox's timeout, a CI runner) unwinds like Ctrl-C, so the server and the agent are stopped
    signal.signal(signal.SIGTERM, _raise_interrupt)
    wanted = set(args.only.split(","))
    agents = tuple(a for a in AGENTS if a.name in wanted)
    install(agents, args.cache)
    model = qwen25_coder_path()
    renderer = PromptRenderer(model)
    runs: list[AgentRun] = []
    with (
        tempfile.TemporaryDirectory(prefix="bubo-agents-") as scratch,
        _BuboServer(model, Path(scratch), args.threads, args.courier, args.slow_prefill) as url,
    ):
        for agent in agents:
            slowed = args.slow_prefill > 0
            command = agent.command(args.cache, TASK, slowed=slowed)
            run = _run(agent, command, url, Path(scratch) / agent.name, args.timeout, slowed=slowed)
            run.cache = httpx.get(f"{url}/debug/cache", timeout=30).json()
            _check(run, renderer)
            if args.slow_prefill > 0:
                _check_guard(run, args.guard)
            runs.append(run)
            if args.record is not None:
                _record(run, args.record, Path(scratch) / agent.name, args.cache)
    report = _report(runs)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(report)
    print(report)
    return 1 if any(run.failures for run in runs) else 0


# ---- the server -----------------------------------------------------------------------------------


class _BuboServer:
    """``bubo serve`` with the coder model on a free loopback port, stopped by PID.

    With *slow_prefill* seconds, the fault-injecting harness instead (the same server, its
    settings from ``BUBO_*`` variables), each prompt chunk delayed that long.
    """

    def __init__(
        self, model: Path, scratch: Path, threads: int, courier: str | None, slow_prefill: float = 0.0
    ) -> None:
        self._model = model
        self._scratch = scratch
        self._log = scratch / "bubo.log"
        self._threads = threads
        self._courier = courier
        self._slow_prefill = slow_prefill
        self._process: subprocess.Popen[bytes] | None = None

    def _command(self, port: int) -> tuple[list[str], dict[str, str] | None]:
        if self._slow_prefill <= 0:
            command = [
                sys.executable, "-m", "bubo", "serve", "-m", str(self._model), "-c", str(CONTEXT),
                "--port", str(port), "--model-names", "any", "-t", str(self._threads), "--debug-hooks", "on",
                *(("--courier", self._courier) if self._courier else ()),
            ]  # fmt: skip
            return command, None
        control = self._scratch / "control"
        control.mkdir()
        (control / "prefill-delay").write_text(str(self._slow_prefill))
        settings = {
            "BUBO_MODEL": str(self._model), "BUBO_CTX_SIZE": str(CONTEXT), "BUBO_MODEL_NAMES": "any",
            "BUBO_THREADS": str(self._threads), "BUBO_DEBUG_HOOKS": "on",
            **({"BUBO_COURIER": self._courier} if self._courier else {}),
        }  # fmt: skip
        command = [sys.executable, str(HARNESS), "--port", str(port), "--control", str(control)]
        return command, {**os.environ, **settings}

    def __enter__(self) -> str:
        port = _free_port()
        command, environment = self._command(port)
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise SystemExit(f"bubo serve exited:\n{self._log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit("bubo serve was not ready within 300 s")

    def __exit__(self, *_: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ---- one agent --------------------------------------------------------------------------------------


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _repository(folder: Path) -> Path:
    """A git repository holding the task's one file, committed."""
    repo = folder / "repo"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text('def add(a, b):\n    """The sum of a and b."""\n    return a - b\n')
    git = ["git", "-c", "user.email=agent@bubo.test", "-c", "user.name=agent", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "calc.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "add()"], check=True)
    return repo


def _run(
    agent: Agent, command: list[str], upstream: str, folder: Path, timeout: float, *, slowed: bool
) -> AgentRun:
    repo = _repository(folder)
    home = folder / "home"
    home.mkdir()
    started = time.monotonic()
    with LoggingProxy(upstream) as proxy:
        environment = {
            "PATH": os.environ.get("PATH", ""),
            **agent.environment(proxy.base_url, home, CONTEXT, slowed=slowed),
        }
        log = folder / f"{agent.name}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                command,
                cwd=repo,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            returncode: int | None = None
            try:
                returncode = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            finally:  # the agent's whole process group, on a timeout or an interrupt alike
                if process.poll() is None:
                    _stop_group(process)
        exchanges = sorted(proxy.exchanges, key=lambda e: e.number)
    print(f"{agent.name}: {len(exchanges)} requests, exit {returncode}, {time.monotonic() - started:.0f} s")
    print(log.read_text(errors="replace")[-1500:])
    return AgentRun(
        agent=agent, exchanges=exchanges, returncode=returncode, seconds=time.monotonic() - started
    )


# ---- the checks -------------------------------------------------------------------------------------


def _check(run: AgentRun, renderer: PromptRenderer) -> None:
    """Non-2xx, errors in streams, and prefixes re-read instead of served from the cache."""
    previous: tuple[int, ...] | None = None
    generating = 0
    for exchange in run.exchanges:
        where = f"{run.agent.name} #{exchange.number} {exchange.method} {exchange.endpoint}"
        if exchange.status is None or not 200 <= exchange.status < 300:
            run.failures.append(f"{where}: status {exchange.status}: {exchange.response_head[:300]!r}")
        run.failures.extend(f"{where}: error in the stream: {error}" for error in exchange.stream_errors)
        if not exchange.endpoint.endswith(GENERATING) or exchange.method != "POST":
            continue
        generating += 1
        tokens = renderer.tokens(exchange.endpoint, exchange.json_body())
        if tokens is None:
            continue
        if previous is not None:
            prefix = shared_prefix(previous, tokens)
            run.prefixes[exchange.number] = prefix
            cached = exchange.cached_tokens
            if prefix >= MIN_PREFIX and cached is not None and prefix - cached > REREAD_LIMIT * prefix:
                run.failures.append(
                    f"{where}: re-read {prefix - cached} of the {prefix} prompt tokens the previous request "
                    f"already had (cached {cached})"
                )
        previous = tokens
    if not any(
        e.status == 200 and e.ended_s is not None for e in run.exchanges if e.endpoint.endswith(GENERATING)
    ):
        run.failures.append(f"{run.agent.name}: no generating request was answered")


def _check_guard(run: AgentRun, guard: float) -> None:
    """A prompt read for longer than the agent's idle guard was answered in full; no request was left."""
    generating = [e for e in run.exchanges if e.endpoint.endswith(GENERATING) and e.method == "POST"]
    for exchange in generating:
        if exchange.left_early:
            run.failures.append(
                f"{run.agent.name} #{exchange.number}: the agent left after {exchange.ended_s or 0:.0f} s "
                f"({exchange.keepalives} keep-alives received)"
            )
    if not any(
        (e.first_token_s or 0) > guard and e.status == 200 and not e.left_early and not e.stream_errors
        for e in generating
    ):
        run.failures.append(
            f"{run.agent.name}: no request waited longer than {guard:.0f} s for its first token and was "
            "answered in full (a longer --slow-prefill?)"
        )


# ---- the report ------------------------------------------------------------------------------------


_COLUMNS = (
    "#",
    "endpoint",
    "status",
    "prompt",
    "cached",
    "shared with previous",
    "first byte s",
    "first token s",
    "total s",
    "keep-alives",
)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _report(runs: list[AgentRun]) -> str:
    lines = ["# Coding agents on Bubo", ""]
    for run in runs:
        ended = "timed out" if run.returncode is None else f"exit {run.returncode}"
        heading = (
            f"## {run.agent.name} ({run.agent.package}, model name {run.agent.model!r}): "
            f"{len(run.exchanges)} requests, {ended}, {run.seconds:.0f} s"
        )
        lines += [
            heading,
            "",
            "| " + " | ".join(_COLUMNS) + " |",
            "|" + "---|" * len(_COLUMNS),
        ]
        for e in run.exchanges:
            cells = (
                e.number, f"{e.method} {e.endpoint}", e.status, e.prompt_tokens, e.cached_tokens,
                run.prefixes.get(e.number), e.first_byte_s, e.first_token_s, e.ended_s, e.keepalives,
            )  # fmt: skip
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        snapshots = run.cache.get("snapshots", [])
        sizes = ", ".join(f"{s['n_tokens']} tokens: {s['size_bytes'] / 2**20:.0f} MiB" for s in snapshots)
        cache = (
            f"Prompt cache after the session: {run.cache.get('live_tokens', '-')} tokens live in the slots, "
            f"{len(snapshots)} snapshots in host RAM taking {run.cache.get('used_bytes', 0) / 2**20:.0f} MiB "
            f"of {run.cache.get('budget_bytes', 0) / 2**20:.0f} MiB ({sizes or 'none'})."
        )
        lines += [
            "",
            cache,
            "",
            *(f"- FAILED: {failure}" for failure in run.failures),
            "",
        ]
    verdict = "FAILED" if any(run.failures for run in runs) else "passed"
    return "\n".join([*lines, f"Result: {verdict}", ""])


# ---- fixtures --------------------------------------------------------------------------------------

_KEPT_HEADERS = {
    "anthropic-beta", "anthropic-version", "user-agent", "x-app", "accept", "content-type", "originator",
    "x-codex-beta-features", "openai-beta",
}  # fmt: skip


def _record(run: AgentRun, folder: Path, scratch: Path, cache: Path) -> None:
    """The agent's first generating requests as fixtures: the headers that shape them, paths scrubbed."""
    folder.mkdir(parents=True, exist_ok=True)
    replacements = {
        str(scratch / "repo"): "/work/repo",
        str(scratch / "home"): "/home/agent",
        str(cache): "/cache",
    }
    kept = [
        e for e in run.exchanges if e.endpoint.endswith(GENERATING) and e.method == "POST" and e.json_body()
    ]
    for index, exchange in enumerate(kept[:3]):
        text = exchange.body.decode()
        for path, placeholder in replacements.items():
            text = text.replace(path, placeholder)
        fixture: dict[str, Any] = {
            "agent": run.agent.package,
            "method": exchange.method,
            "path": exchange.path,
            "headers": {k.lower(): v for k, v in exchange.headers.items() if k.lower() in _KEPT_HEADERS},
            "body": json.loads(text),
        }
        target = folder / f"{run.agent.name}-{index}.json"
        target.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
        print(f"recorded {target}")
    shutil.rmtree(scratch / "home", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
