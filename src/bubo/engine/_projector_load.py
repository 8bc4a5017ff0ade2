"""Loading a multimodal projector file (``--mmproj``) over the text model, and what is refused there.

Refused at load, with a message that says why (never a NULL dereference):

- a projector whose output width is not the model's input embedding width
  (mtmd returns NULL): when the caller passes the width read from the file
  (``bubo.model.read_projector``) the mismatch is named exactly and mtmd is not
  even called; else mtmd's own check refuses it;
- a file llama.cpp cannot read as a projector;
- a projector that needs M-RoPE positions (Qwen2-VL and its kind): an image
  there takes fewer KV positions than embeddings, and the engine keeps one
  position per prompt token;
- a projector without a vision encoder (an audio one): Bubo reads images only.

mtmd's log lines (its own, its helpers' and its CLIP encoder's) go to Python
logging under ``bubo.llama_cpp.mtmd``, its chatter at DEBUG.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp
from llama_cpp import mtmd_cpp

from ._projector import Projector, ProjectorRefused

__all__ = ["load_projector"]

mtmd_logger = logging.getLogger("bubo.llama_cpp.mtmd")

# ggml log levels (1 debug ... 4 error, 5 continuation) -> logging levels; mtmd's INFO chatter goes to DEBUG
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


def _mtmd_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if text:
        mtmd_logger.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text.decode(errors="replace").rstrip())


# mtmd keeps this pointer for the life of the process: it must never be collected.
_MTMD_LOG_CALLBACK = llama_cpp.llama_log_callback(_mtmd_log)


def _route_mtmd_logs() -> None:
    """Send mtmd's, its helpers' and its CLIP encoder's log lines to Python logging (process-wide)."""
    mtmd_cpp.mtmd_helper_log_set(_MTMD_LOG_CALLBACK, ctypes.c_void_p())


def load_projector(
    path: Path,
    model: object,
    *,
    use_gpu: bool,
    n_threads: int,
    image_min_tokens: int | None,
    image_max_tokens: int | None,
    output_width: int | None = None,
) -> Projector:
    """Load the projector at *path* over the llama.cpp *model* (blocking: call from a worker thread).

    *use_gpu*: run the encoder on the GPU backend when there is one
    (``--no-mmproj-offload`` turns it off); *n_threads*: the encoder's CPU
    threads; *image_min_tokens*, *image_max_tokens*: bounds on an image's
    tokens for projectors of dynamic resolution (None: the file's own).
    *output_width*: the projector's output width as read from its file
    (``bubo.model.read_projector``), checked against the model's before
    mtmd sees the file; None leaves the check to mtmd.  mtmd runs one
    warm-up encode of its largest image, so its compute buffer is
    reserved here.

    Raises:
        ProjectorRefused: the projector is another model's, not a projector
            llama.cpp reads, has no vision encoder, or needs M-RoPE positions.

    """
    _route_mtmd_logs()
    n_embd: int = llama_cpp.llama_model_n_embd_inp(model)
    if output_width is not None and output_width != n_embd:
        raise ProjectorRefused(
            f"the projector {path}: its output width {output_width} differs from the model's n_embd "
            f"{n_embd} (a projector made for another model)"
        )
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = use_gpu
    params.n_threads = n_threads
    params.print_timings = False
    params.warmup = True
    params.image_min_tokens = -1 if image_min_tokens is None else image_min_tokens  # -1: the file's
    params.image_max_tokens = -1 if image_max_tokens is None else image_max_tokens
    ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), model, params)
    if not ctx:
        raise ProjectorRefused(
            f"llama.cpp could not load the projector {path} over this model (n_embd {n_embd}); its log "
            f"says why: a file that is no projector, or one made for another model, are the usual causes"
        )
    try:
        _refuse_what_bubo_cannot_drive(ctx, path)
        return Projector(ctx, path=path, n_embd=n_embd)
    except BaseException:
        mtmd_cpp.mtmd_free(ctx)
        raise


def _refuse_what_bubo_cannot_drive(ctx: int, path: Path) -> None:
    """Raise unless the fresh mtmd context *ctx* places images one position per embedding and reads them.

    Raises:
        ProjectorRefused: the projector needs M-RoPE positions, or has no vision encoder.

    """
    if mtmd_cpp.mtmd_decode_use_mrope(ctx):
        raise ProjectorRefused(
            f"the projector {path} places images with M-RoPE positions (several embeddings per KV "
            f"position): such models are not supported yet"
        )
    if not mtmd_cpp.mtmd_support_vision(ctx):
        raise ProjectorRefused(
            f"the projector {path} has no vision encoder (an audio projector): Bubo reads images only"
        )
