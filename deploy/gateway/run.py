#!/usr/bin/env python3
"""N ``bubo serve`` replicas on 127.0.0.1 behind the Shepherd Model Gateway (smg), on one host.

    python3 deploy/gateway/run.py [--replicas 3] [--port 8080] -- [bubo serve flags: -m, -t, -c ...]

Starts the replicas on the ports after ``--port`` (8081, 8082, ...), then
``smg launch`` on ``--port`` in front of them with the ``cache_aware`` policy
(and with ``--responses-port`` a second smg that keeps the Responses API's
history), and prints each command first.  Clients talk to the gateway only.  SIGINT or
SIGTERM stops smg, then the replicas (each drains: docs/deploy.md#draining);
so does any of them exiting.  Standard library only; ``bubo`` and ``smg`` are
found on PATH (``--bubo``/``--smg`` to give them).  Every flag is explained in
docs/deploy.md#one-host.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

# smg asks each replica's /ready every HEALTH_INTERVAL_S seconds and takes it out after
# HEALTH_FAILURES failed answers in a row; one good answer puts it back.
HEALTH_INTERVAL_S = 2
HEALTH_FAILURES = 2
# After SIGTERM a replica answers /ready 503 but keeps serving for this long: smg's checks
# notice within HEALTH_FAILURES * HEALTH_INTERVAL_S (4 s), plus a check's own time.
DRAIN_DELAY_S = HEALTH_FAILURES * HEALTH_INTERVAL_S + 2
# How long one process may take to stop after SIGTERM before it is killed: Bubo's
# --drain-delay and --shutdown-timeout (30 s), and 10 s to end interrupted streams.
STOP_WAIT_S = DRAIN_DELAY_S + 30 + 10 + 5


def replica_command(bubo: str, port: int, serve_flags: Sequence[str]) -> list[str]:
    """One replica: loopback only, draining for DRAIN_DELAY_S seconds before it refuses work."""
    return [bubo, "serve", "--host", "127.0.0.1", "--port", str(port), "--drain-delay", str(DRAIN_DELAY_S),
            *serve_flags]  # fmt: skip


def gateway_command(
    smg: str, port: int, metrics_port: int, policy: str, replica_ports: Sequence[int]
) -> list[str]:
    """The gateway in front of the replicas, checking /ready (not /health: a draining replica is alive)."""
    return [
        smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
        "--worker-urls", *(f"http://127.0.0.1:{p}" for p in replica_ports),
        "--health-check-endpoint", "/ready",
        "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
        "--health-failure-threshold", str(HEALTH_FAILURES),
        "--health-success-threshold", "1",
        "--worker-startup-check-interval", "1",  # a replica that is loading is asked again each second
        # cache_aware leaves a prefix's replica once it runs more than the mean and 1.2 times it: smg's
        # defaults (64 requests, 1.5 times) suit GPU servers, not replicas of a few slots (docs/deploy.md)
        "--balance-abs-threshold", "0", "--balance-rel-threshold", "1.2",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
    ]  # fmt: skip


def responses_command(smg: str, port: int, metrics_port: int, gateway_port: int) -> list[str]:
    """A second smg that keeps the Responses API's history itself, in front of the gateway.

    It stores each response (``--history-backend memory``) and sends the whole
    conversation, ``store`` false, to the gateway, which routes it by prefix:
    ``previous_response_id`` then works whichever replica answers (docs/deploy.md).
    """
    return [
        smg, "launch", "--host", "127.0.0.1", "--port", str(port),
        "--backend", "openai", "--history-backend", "memory",
        "--worker-urls", f"http://127.0.0.1:{gateway_port}",
        "--worker-startup-check-interval", "1",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
    ]  # fmt: skip


def commands(args: argparse.Namespace) -> list[list[str]]:
    """The replicas' command lines, then the gateway's, then (``--responses-port``) the Responses front's."""
    ports = [args.port + 1 + i for i in range(args.replicas)]
    replicas = [replica_command(args.bubo, port, args.serve_flags) for port in ports]
    gateway = gateway_command(args.smg, args.port, args.metrics_port, args.policy, ports)
    if not args.responses_port:
        return [*replicas, gateway]
    front = responses_command(args.smg, args.responses_port, args.metrics_port + 1, args.port)
    return [*replicas, gateway, front]


def parser() -> argparse.ArgumentParser:
    """The flags; what follows ``--`` goes to every ``bubo serve``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3, help="bubo serve processes (3)")
    parser.add_argument(
        "--port", type=int, default=8080, help="the gateway's port; replicas take the next ones"
    )
    parser.add_argument("--metrics-port", type=int, default=29000, help="smg's Prometheus port (29000)")
    parser.add_argument("--policy", default="cache_aware", help="smg's routing policy (cache_aware)")
    parser.add_argument(
        "--responses-port", type=int, default=0, help="also a Responses front with its own store on this port"
    )
    parser.add_argument("--bubo", default="bubo", help="the bubo executable")
    parser.add_argument("--smg", default="smg", help="the smg executable")
    parser.add_argument("serve_flags", nargs="*", help="after --: flags for every bubo serve")
    return parser


def stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each, then wait for each (SIGKILL after STOP_WAIT_S)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Start everything, wait until a signal or a process ends, stop everything; the exit status."""
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    started: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands(args):
            print("+", shlex.join(command), flush=True)  # noqa: T201 - what runs, as a shell would show it
            # Each in its own session: a Ctrl-C reaches this script alone, which then signals each
            # process once (a second signal would end a draining replica at once).
            started.append(subprocess.Popen(command, start_new_session=True))  # noqa: S603 - our own argv
        while all(process.poll() is None for process in started):
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        for tier in (started[args.replicas + 1 :], started[args.replicas : args.replicas + 1]):
            stop(tier)  # the fronts first, so that nothing more is sent to what stops after them
        stop(started[: args.replicas])
    return 1  # one of them exited by itself


if __name__ == "__main__":
    sys.exit(main())
