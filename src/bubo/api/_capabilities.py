"""llama-server's ``capabilities`` words (``/v1/models``' ``models`` and ``/props``), from one source.

The list is :class:`~bubo.service.capabilities.Capabilities` in llama-server's
words: ``completion``, ``multimodal`` (images, ``--mmproj``), ``embedding``
and ``rerank``, each only where the server answers it.  Ollama's words are the
Ollama dialect's (``api/ollama/routes.py``), from the same source.
"""

from __future__ import annotations

from bubo.service.capabilities import Capabilities

__all__ = ["llama_server_capabilities"]


def llama_server_capabilities(served: Capabilities) -> list[str]:
    """*served* in llama-server's words, in its order (``completion`` first)."""
    words = [
        ("completion", served.completion),
        ("multimodal", served.vision),
        ("embedding", served.embedding),
        ("rerank", served.rerank),
    ]
    return [word for word, on in words if on]
