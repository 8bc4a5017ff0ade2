"""Reading a chat-completions body for the routes that render or count it without generating.

``/apply-template`` (llama-server) and ``/v1/chat/completions/input_tokens``
take the body with ``model`` optional (checked when given), and run their
render or count on the workers, sized by the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from bubo.api._context import read_body
from bubo.domain.requests import ChatRequest
from bubo.service.chat import prompt_chars
from bubo.service.prompt import image_work_bytes, reading_images
from bubo.service.runtime import Runtime
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from . import translate, wire

__all__ = ["chat_request_without_model", "on_the_prompt"]

T = TypeVar("T")


async def chat_request_without_model(runtime: Runtime) -> ChatRequest:
    """The request's chat-completions body, translated; ``model`` may be left out, as llama-server allows.

    Raises:
        InvalidRequest: the body is refused.
        NotFound: it names a model not served here.

    """

    def translated(body: wire.ChatCompletionRequest) -> ChatRequest:
        if body.model is not None:
            runtime.check_model(body.model)
        return translate.chat_request(body, takes_images=runtime.engine.vision is not None)

    _, chat = await read_body(runtime, wire.ChatCompletionRequest, translated)
    return chat


async def on_the_prompt(runtime: Runtime, chat: ChatRequest, job: Callable[[], T]) -> T:
    """*job* (a render or a count of *chat*) on the workers, its memory sized by the prompt.

    A prompt with images (a model that takes them) holds the model awake while
    *job* may read them, and its memory counts their decoding.
    """
    images = chat.prompt.images
    need_bytes = prompt_chars(chat.prompt) * PREPARE_BYTES_PER_CHAR + image_work_bytes(runtime, images)
    async with reading_images(runtime, images):
        return await runtime.workers.run(job, need_bytes=need_bytes)
