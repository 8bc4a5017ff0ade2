"""The probe child: load the model as the server will, decode a prompt and a token, exit 0.

Run as ``python -m bubo.engine._probe_child`` with :func:`bubo.engine.probe.probe_payload`
as JSON on standard input.  A native crash kills only this process; the parent
reads the signal from the exit status.

``BUBO_PROBE_FAULT`` (tests only) makes a child that repacks fault on purpose
after loading: ``segv`` raises SIGSEGV on itself, ``hang`` never returns.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from .llama import DraftOptions, LlamaOptions, load_llama_engine
from .probe import FAULT_VARIABLE, PROBE_CONTEXT
from .values import RepackDecision


def main() -> int:
    """Load, decode, free; the exit status is the verdict."""
    payload = json.loads(sys.stdin.read())
    repack = bool(payload.pop("repack"))
    options = LlamaOptions(
        model_path=Path(payload.pop("model_path")),
        n_ctx=PROBE_CONTEXT,
        cache_ram_mib=0,
        drafting=DraftOptions(draft_max=0),
        repack=RepackDecision(enabled=repack, reason="probe"),
        **payload,
    )
    engine = load_llama_engine(options)
    try:
        if repack:
            _fault_on_purpose(os.environ.get(FAULT_VARIABLE, ""))
        engine.check_decode(batch=min(64, options.n_batch))
    finally:
        engine.close()
    return 0


def _fault_on_purpose(fault: str) -> None:
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "hang":
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
