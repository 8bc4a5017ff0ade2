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
from typing import Any

from ._prefill_budget import DEFAULT_GAP_S
from .llama import DraftOptions, LlamaOptions, load_llama_engine
from .probe import FAULT_VARIABLE, PROBE_CONTEXT
from .values import RepackDecision

_BARE: dict[str, Any] = {
    "n_ctx": PROBE_CONTEXT,
    "prefill_chunk": 0,
    "prefill_gap_ms": DEFAULT_GAP_S * 1000.0,
    "n_parallel": 1,
    "kv_unified": True,
    "slot_prompt_similarity": 0.0,
    "cache_ram_mib": 0,
    "cache_idle_slots": False,
    "cache_disk_dir": None,
    "cache_disk_mib": 0,
    "cache_disk_max_age_days": 1.0,
    "embeddings": False,
    "pooling": None,
    "mmproj": None,
    "mmproj_output_width": None,
    "mmproj_offload": False,
    "image_min_tokens": None,
    "image_max_tokens": None,
    "image_max_pixels": 1,
    "image_max_count": 0,
    "drafting": DraftOptions(draft_max=0),
    "draft_model_path": None,
    "n_ctx_draft": 0,
    "n_gpu_layers_draft": 0,
    "context_shift": False,
    "max_unread_mib": 1,
    "cache_reuse": 0,
    "courier": "off",
    "lora": (),
}
"""The rest of the probe's load, the least that decodes: one small slot, no caches, drafting,
projector, embeddings or adapters (none of them moves the weights the verdict is about)."""


def main() -> int:
    """Load, decode, free; the exit status is the verdict."""
    payload = json.loads(sys.stdin.read())
    repack = bool(payload.pop("repack"))
    options = LlamaOptions(
        model_path=Path(payload.pop("model_path")),
        repack=RepackDecision(enabled=repack, reason="probe"),
        **payload,  # what the weights' placement depends on, as the server will load them
        **_BARE,
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
