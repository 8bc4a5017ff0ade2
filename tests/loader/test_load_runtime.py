"""Loading a runtime from settings: template choice, tokenizer, names (real GGUFs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubo.config import load_settings
from bubo.domain.messages import ChatPrompt, Message
from bubo.errors import InvalidRequest
from bubo.loader import cache_ram_mib, load_runtime
from bubo.model import GGUFError
from bubo.service.prompt import render_chat

from .._models import gemma3_path

pytestmark = pytest.mark.llama


def test_default_model(model_path: Path) -> None:
    """The default model loads with its own template, the HF tokenizer and a derived id."""
    progress: list[float] = []
    runtime = load_runtime(load_settings({"model__ctx_size": "512"}, environ={}), progress.append)
    try:
        assert runtime.model_id == "smollm2-135m-instruct-q4-1"
        assert runtime.template.origin == "gguf"
        assert runtime.tokenizer.name == "huggingface-tokenizers"
        assert runtime.engine.info.n_ctx == 512
        assert progress[-1] == 1.0
    finally:
        runtime.engine.close()


def test_chat_template_file_overrides(model_path: Path, tmp_path: Path) -> None:
    """--chat-template-file replaces the model's template."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>>")
    runtime = load_runtime(
        load_settings({"model__ctx_size": "256", "serving__chat_template_file": str(template)}, environ={}),
        lambda _: None,
    )
    try:
        assert runtime.template.origin == f"file:{template}"
        rendered = render_chat(runtime, ChatPrompt(messages=(Message(role="user", content="hi"),)))
        assert rendered.text == "[user] hi\n>>"
    finally:
        runtime.engine.close()


def test_model_without_template_gets_chatml_and_single_bos() -> None:
    """A GGUF without a chat template (Gemma 3 base) renders ChatML; BOS is added once."""
    runtime = load_runtime(
        load_settings({"model__path": str(gemma3_path()), "model__ctx_size": "256"}, environ={}),
        lambda _: None,
    )
    try:
        assert runtime.template.origin == "builtin-chatml"
        rendered = render_chat(runtime, ChatPrompt(messages=(Message(role="user", content="hi"),)))
        assert rendered.text.startswith("<|im_start|>user\nhi<|im_end|>")
        bos = runtime.tokenizer.encode("", add_special=True)
        assert bos
        assert rendered.tokens[: len(bos)] == tuple(bos)
        assert rendered.tokens.count(bos[0]) == 1
    finally:
        runtime.engine.close()


def test_template_printing_bos_does_not_double_it(tmp_path: Path) -> None:
    """A template that prints BOS while the tokenizer adds it gives one BOS, as in llama.cpp."""
    template = tmp_path / "bos.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    settings = load_settings(
        {
            "model__path": str(gemma3_path()),
            "model__ctx_size": "256",
            "serving__chat_template_file": str(template),
        },
        environ={},
    )
    runtime = load_runtime(settings, lambda _: None)
    try:
        rendered = render_chat(runtime, ChatPrompt(messages=(Message(role="user", content="hi"),)))
        bos = runtime.tokenizer.encode("", add_special=True)[0]
        assert rendered.text == "hi"
        assert rendered.tokens == (bos, *runtime.tokenizer.encode("hi"))
    finally:
        runtime.engine.close()


@pytest.mark.parametrize(
    ("values", "admits"),
    [
        ({"requests__grammar": 'root ::= "yes" | "no"'}, '"yes" | "no"'),
        (
            {"requests__json_schema": '{"type": "object", "properties": {"answer": {"const": "yes"}}}'},
            "answer",
        ),
    ],
)
def test_a_default_constraint_from_a_flag(model_path: Path, values: dict[str, str], admits: str) -> None:
    """--grammar and --json-schema become the GBNF that constrains requests that set none."""
    runtime = load_runtime(load_settings({"model__ctx_size": "256", **values}, environ={}), lambda _: None)
    try:
        assert runtime.default_grammar is not None
        assert admits in runtime.default_grammar
    finally:
        runtime.engine.close()


def test_a_default_schema_beyond_the_limits_stops_the_start(model_path: Path) -> None:
    """A --json-schema the grammar cannot enforce is refused at start, naming the flag."""
    with pytest.raises(InvalidRequest) as error:
        load_runtime(
            load_settings(
                {"model__ctx_size": "256", "requests__json_schema": '{"type": "string", "pattern": "(a"}'},
                environ={},
            ),
            lambda _: None,
        )
    assert error.value.param.startswith("--json-schema")
    assert str(error.value).startswith("--json-schema: ")


@pytest.mark.parametrize(
    ("setting", "available_gib", "expected_mib"),
    [(-1, 8, 2048), (-1, 64, 8192), (-1, 1, 256), (0, 64, 0), (512, 64, 512)],
)
def test_cache_ram_auto_is_a_quarter_of_the_free_memory_up_to_llama_servers_8_gib(
    setting: int, available_gib: int, expected_mib: int
) -> None:
    """--cache-ram -1 (the default) takes a quarter of the memory available at start, at most 8 GiB."""
    assert cache_ram_mib(setting, available_gib * 1024**3) == expected_mib


@pytest.mark.parametrize("flag", [{"model__reranking": "on"}, {"model__pooling": "rank"}])
def test_rank_pooling_without_a_classifier_head_stops_the_start(
    model_path: Path, flag: dict[str, str]
) -> None:
    """--reranking (or --pooling rank) on SmolLM2, which has no classifier head, is refused before llama.cpp loads."""
    progress: list[float] = []
    with pytest.raises(GGUFError, match="has no classifier head") as error:
        load_runtime(load_settings({"model__ctx_size": "256", **flag}, environ={}), progress.append)
    assert str(error.value).startswith("--reranking: " if "model__reranking" in flag else "--pooling rank: ")
    assert progress == []  # llama.cpp never began loading the weights


def test_a_reranker_loads_with_reranking(reranker_path: Path) -> None:
    """--reranking on a reranker GGUF: rank pooling, no generation, listed for rerank."""
    settings = load_settings({"model__path": str(reranker_path), "model__reranking": "on"}, environ={})
    runtime = load_runtime(settings, lambda _: None)
    try:
        assert runtime.engine.embedder is not None
        assert runtime.engine.embedder.pooling == "rank"
        served = runtime.capabilities
        assert (served.rerank, served.embedding, served.completion) == (True, False, False)
        assert runtime.kv_cache is None  # an encoder keeps none
    finally:
        runtime.engine.close()
