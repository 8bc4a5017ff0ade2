"""Bubo: a local LLM inference server for one GGUF model, in four API dialects."""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib.metadata import version  # noqa: PLC0415 - lazy: keeps `import bubo` instant

        return version("bubo")
    raise AttributeError(name)
