"""The prompt Bubo renders for a recorded request, token for token, without a server.

The harness compares consecutive requests' prompts to tell how much of a
request the previous one already had (its shared prefix): the part the prompt
cache should serve.  It renders with Bubo's own code, the dialect's wire model
and translation, the model's chat template and tokenizer from the GGUF, so
the tokens are those the server evaluates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bubo.api._chat import translate as chat_translate
from bubo.api._chat import wire as chat_wire
from bubo.api._converter import make_converter, structure
from bubo.api.anthropic import translate as anthropic_translate
from bubo.api.anthropic import wire as anthropic_wire
from bubo.api.responses import translate as responses_translate
from bubo.api.responses import wire as responses_wire
from bubo.domain.requests import ChatRequest
from bubo.engine.fake import FakeEngine
from bubo.model import read_metadata
from bubo.service.chat import render_chat_request
from bubo.service.runtime import Runtime
from bubo.templates import ChatTemplate
from bubo.tokenizer import build_hf_tokenizer

__all__ = ["PromptRenderer", "shared_prefix"]


class PromptRenderer:
    """Renders the chat requests of every dialect as the server would, for one GGUF."""

    def __init__(self, model: Path) -> None:
        metadata = read_metadata(model)
        tokenizer = build_hf_tokenizer(metadata)
        template = ChatTemplate(
            metadata["tokenizer.chat_template"],
            bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token,
            origin="gguf",
        )
        self._runtime = Runtime(
            model_id="harness", created=0, engine=FakeEngine(), tokenizer=tokenizer, template=template
        )
        self._converter = make_converter()

    def tokens(self, endpoint: str, body: Any) -> tuple[int, ...] | None:
        """The prompt's token ids, or None for a request that renders no chat prompt."""
        request = self._request(endpoint, body)
        if request is None:
            return None
        return render_chat_request(self._runtime, request).tokens

    def _request(self, endpoint: str, body: Any) -> ChatRequest | None:
        if not isinstance(body, dict):
            return None
        converter = self._converter
        if endpoint.endswith("/messages"):
            count = structure(converter, body, anthropic_wire.CountTokensRequest)
            return anthropic_translate.count_request(count)
        if endpoint.endswith("/chat/completions"):
            return chat_translate.chat_request(structure(converter, body, chat_wire.ChatCompletionRequest))
        if endpoint.endswith("/responses"):
            responses = structure(converter, body, responses_wire.ResponsesRequest)
            return responses_translate.responses_request(converter, responses, ()).request
        return None


def shared_prefix(first: tuple[int, ...], second: tuple[int, ...]) -> int:
    """How many leading tokens two prompts share."""
    size = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        size += 1
    return size


def dumps(value: Any) -> str:
    """Compact JSON (for fixtures)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
