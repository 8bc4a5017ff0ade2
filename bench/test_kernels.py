"""bench/kernels.py: llama-bench's JSON read, the two builds' tests paired, the reference found."""

from __future__ import annotations

import json
from pathlib import Path

import kernels
import pytest

REPORT = json.dumps(
    [
        {"n_prompt": 512, "n_gen": 0, "flash_attn": 0, "avg_ts": 437.9, "stddev_ts": 2.5, "model_type": "x"},
        {"n_prompt": 0, "n_gen": 128, "flash_attn": 0, "avg_ts": 171.1, "stddev_ts": 0.4},
        {"n_prompt": 512, "n_gen": 0, "flash_attn": 1, "avg_ts": 478.3, "stddev_ts": 1.0},
        {"n_prompt": 0, "n_gen": 128, "flash_attn": 1, "avg_ts": 187.6, "stddev_ts": 0.9},
    ]
)


def test_each_test_is_named_by_what_it_measures() -> None:
    results = kernels.parse_results(REPORT)
    assert [(r.test, r.flash_attn, r.tok_s, r.stddev) for r in results] == [
        ("pp512", 0, 437.9, 2.5),
        ("tg128", 0, 171.1, 0.4),
        ("pp512", 1, 478.3, 1.0),
        ("tg128", 1, 187.6, 0.9),
    ]


def test_the_table_pairs_the_same_test_and_gives_the_vendored_build_over_the_reference() -> None:
    ours = kernels.parse_results(REPORT)
    theirs = [r for r in kernels.parse_results(REPORT) if r.flash_attn]  # fa off missing there
    theirs = [kernels.Result(r.test, r.flash_attn, r.tok_s / 2, r.stddev) for r in theirs]
    rows = kernels.table(Path("/models/m.gguf"), ours, theirs)[2:]
    assert [row.split()[:2] for row in rows] == [["pp512", "1"], ["tg128", "1"]]  # only tests both ran
    assert all(row.endswith("2.000") for row in rows)


def test_both_builds_run_one_command_line() -> None:
    args = kernels.parser().parse_args(
        ["--threads", "3", "--prompt", "64", "--gen", "16", "--flash-attn", "1"]
    )
    command = kernels.bench_command(Path("/b/llama-bench"), Path("/m.gguf"), args)
    assert command == [
        "/b/llama-bench", "-m", "/m.gguf", "-t", "3", "-p", "64", "-n", "16",
        "-fa", "1", "-r", "3", "-o", "json",
    ]  # fmt: skip


def test_the_reference_is_the_llama_bench_beside_llama_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "llama-server").touch()
    monkeypatch.setenv("LLAMA_SERVER", str(tmp_path / "llama-server"))
    with pytest.raises(SystemExit, match="no llama-bench beside llama-server"):
        kernels.reference_bench(None)
    (tmp_path / "llama-bench").touch()
    assert kernels.reference_bench(None) == tmp_path / "llama-bench"
    assert kernels.reference_bench(Path("/other/llama-bench")) == Path("/other/llama-bench")


def test_a_vendored_build_already_there_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.importlib.metadata, "version", lambda _name: "9.9.9")
    built = tmp_path / "llama_cpp_python-9.9.9" / "build" / "bin" / "llama-bench"
    built.parent.mkdir(parents=True)
    built.touch()

    def no_build(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("nothing is downloaded or built")

    monkeypatch.setattr(kernels.subprocess, "run", no_build)
    assert kernels.vendored_bench(tmp_path, jobs=2) == built
