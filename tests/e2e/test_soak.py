"""The soak script's one-minute run: many clients, every dialect, random disconnects, no leaks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

SOAK = Path(__file__).resolve().parents[2] / "soak" / "soak.py"


def test_one_minute_soak(tmp_path: Path) -> None:
    """soak/soak.py --minutes 1 passes all its checks with more clients than slots; the report shows the load."""
    report_path = tmp_path / "soak.json"
    command = [
        sys.executable, str(SOAK), "--minutes", "1", "--clients", "8", "--parallel", "4",
        "--json", str(report_path), "--log", str(tmp_path / "server.log"),
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert all(report["checks"].values()), report["checks"]
    assert report["server_exit_status"] == 0
    assert report["disconnects"] > 0
    assert set(report["by_call"]) >= {"chat", "completions", "completion", "responses", "messages", "invalid"}
    assert {"200", "400"} <= set(report["by_status"])
