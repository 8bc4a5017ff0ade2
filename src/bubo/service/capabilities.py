"""What the loaded model is served for, asked of the engine and the template in one place.

Every list a dialect shows (Ollama's ``/api/show`` ``capabilities``,
llama-server's ``/v1/models`` ``models[].capabilities`` and ``/props``) is
this, in the dialect's words, so none can claim what the server would refuse.
Each field is true exactly where its request is answered:

- ``completion``: the model generates (chat, completions; an encoder does not);
- ``tools``: with it, since a template without a tools section gets Bubo's;
- ``embedding``: an embedding context is open (``--embeddings``, or an
  encoder) and its pooling is not ``rank``; with pooling ``none`` (a
  generative model's own) each text's vector is its last token's, as Ollama
  pools such a model (``service/embeddings.py``);
- ``rerank``: that context ranks (``--reranking``, ``--pooling rank``);
- ``vision``: a projector reads images (``--mmproj``);
- ``insert``: the vocabulary has fill-in-the-middle tokens (``/infill``,
  Ollama's ``suffix``);
- ``thinking``: the chat template thinks.
"""

from __future__ import annotations

import attrs

from bubo.engine import ModelFacts
from bubo.templates import ChatTemplate

__all__ = ["Capabilities", "capabilities_of"]


@attrs.frozen(kw_only=True)
class Capabilities:
    """What requests the served model answers (see the module's docstring)."""

    completion: bool
    tools: bool
    embedding: bool
    rerank: bool
    vision: bool
    insert: bool
    thinking: bool


def capabilities_of(engine: ModelFacts, template: ChatTemplate) -> Capabilities:
    """What *engine* (and, for thinking, *template*) can serve."""
    generates = engine.info.generates
    embedder = engine.embedder
    pooling = None if embedder is None else embedder.pooling
    return Capabilities(
        completion=generates,
        tools=generates,
        embedding=pooling is not None and pooling != "rank",
        rerank=pooling == "rank",
        vision=generates and engine.vision is not None,
        insert=generates and engine.info.fim is not None,
        thinking=generates and template.supports_thinking,
    )
