"""Fuzz harnesses: Hypothesis drives the request converters, the SSE encoders and the stream parsers.

Invariant everywhere: a clean 4xx error in the route's documented shape, or a
valid result, never another exception and never a 5xx.  ``nox -s tests`` runs
a short pass (the ``ci`` profile, 150 examples per harness); ``nox -s fuzz``
a long one: batches of ``BUBO_FUZZ_EXAMPLES`` (2,000) fresh examples per
harness until ``BUBO_FUZZ_SECONDS`` (300) have passed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from quart_trio import QuartTrio
from tests._llama_options import engine_options

from bubo.api._context import EXTENSION_KEY
from bubo.config import default_model_path, load_settings
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.engine.llama import LlamaEngine, load_llama_engine
from bubo.model import read_metadata
from bubo.server import create_app
from bubo.service.runtime import Runtime, Status
from bubo.templates import ChatTemplate
from bubo.tokenizer import build_hf_tokenizer


def _runtime() -> Runtime:
    path: Path = default_model_path()
    metadata = read_metadata(path)
    tokenizer = build_hf_tokenizer(metadata)
    template = ChatTemplate(
        metadata["tokenizer.chat_template"],
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        origin="gguf",
    )
    # a short reply: quart-trio's test client holds at most 10 streamed chunks
    engine = FakeEngine(script=FakeScript(reply="Hi there."))
    return Runtime(model_id="fuzz-model", created=0, engine=engine, tokenizer=tokenizer, template=template)


@pytest.fixture(name="app")
async def _app() -> AsyncIterator[QuartTrio]:
    runtime = _runtime()
    app = create_app(load_settings({}, environ={}), load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        state = app.extensions[EXTENSION_KEY].state
        with trio.fail_after(10):
            while state.status is Status.LOADING:
                await trio.sleep(0.01)
        yield test_app  # type: ignore[misc]


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LlamaEngine]:
    """The real engine on the default model, for harnesses that check what llama.cpp accepts."""
    path: Path = default_model_path()
    engine = load_llama_engine(engine_options(model_path=path, n_ctx=256, n_threads=1))
    yield engine
    engine.close()
