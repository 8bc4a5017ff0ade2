"""Decode speed: Bubo over HTTP vs llama-cpp-python's own Llama.create_completion, same run.

Usage: python bench/decode_vs_llama_cpp_python.py [--tokens 256] [--rounds 3]

Both decode the same prompt greedily for the same number of tokens (EOS
ignored) with 2 threads and a 4096-token context; the servers alternate
round by round and the medians are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx
from llama_cpp import Llama

from bubo.config import default_model_path

PROMPT = "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


def llama_cpp_python_rate(model: str, tokens: int) -> float:
    llm = Llama(model_path=model, n_ctx=4096, n_threads=2, verbose=False, logits_all=False, flash_attn=True)
    llm.create_completion(PROMPT, max_tokens=4, temperature=0)  # warm up
    started = None
    count = 0
    for _ in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0, stream=True, repeat_penalty=1.0):
        if started is None:
            started = time.perf_counter()
        count += 1
    assert started is not None
    return (count - 1) / (time.perf_counter() - started)


def bubo_rate(base: str, tokens: int) -> float:
    body = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    started = None
    count = 0
    with httpx.stream("POST", base + "/completion", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("stop"):
                break
            if started is None:
                started = time.perf_counter()
            count += 1
    assert started is not None
    return (count - 1) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = str(default_model_path())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "BUBO_CTX_SIZE": "4096", "BUBO_THREADS": "2", "BUBO_LOG_LEVEL": "warning"}
    server = subprocess.Popen(
        [sys.executable, "-m", "bubo", "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        bubo_rate(base, 4)  # warm up
        bubo, reference = [], []
        for _ in range(args.rounds):
            bubo.append(bubo_rate(base, args.tokens))
            reference.append(llama_cpp_python_rate(model, args.tokens))
    finally:
        server.terminate()
        server.wait(timeout=30)
    b, r = statistics.median(bubo), statistics.median(reference)
    print(f"decode {args.tokens} tokens, median of {args.rounds}:")
    print(f"  bubo (HTTP stream)                 {b:6.1f} tok/s  {[round(x, 1) for x in bubo]}")
    print(f"  llama-cpp-python create_completion {r:6.1f} tok/s  {[round(x, 1) for x in reference]}")
    print(f"  ratio bubo / llama-cpp-python      {b / r:6.3f}")


if __name__ == "__main__":
    main()
