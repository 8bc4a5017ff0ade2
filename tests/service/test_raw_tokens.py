"""Raw prompts (llama-server's ``prompt`` and ``/tokenize``'s ``content``) to token ids: the one path.

On Gemma 3, whose GGUF adds BOS (id 2, ``<bos>``), so every BOS rule shows.
"""

from __future__ import annotations

import pytest

from bubo.errors import BuboError, InvalidRequest
from bubo.model import read_metadata
from bubo.service.prompt import raw_tokens
from bubo.tokenizer import HFTokenizer, build_hf_tokenizer

from .._models import gemma3_path


class Overflow(BuboError):
    def __init__(self, n_tokens: int, at_least: bool) -> None:
        super().__init__(f"{'at least ' if at_least else ''}{n_tokens}")
        self.n_tokens = n_tokens
        self.at_least = at_least


@pytest.fixture(name="gemma", scope="module")
def _gemma() -> HFTokenizer:
    return build_hf_tokenizer(read_metadata(gemma3_path()))


def tokens(tokenizer: HFTokenizer, prompt, **options) -> list[int]:
    options.setdefault("room", None)
    return raw_tokens(tokenizer, prompt, param="prompt", overflow=Overflow, **options)


def test_the_tokenizer_names_its_bos(gemma) -> None:
    assert gemma.add_bos
    assert gemma.bos_id == 2
    assert gemma.encode("", add_special=True) == [gemma.bos_id]


def test_generation_puts_bos_in_front_once(gemma) -> None:
    """BOS is added unless the prompt already starts with it, as an id or as markup."""
    hello = gemma.encode("Hello")
    assert tokens(gemma, ("Hello",)) == [2, *hello]
    assert tokens(gemma, (2, "Hello")) == [2, *hello]
    assert tokens(gemma, ("<bos>Hello",)) == [2, *hello]
    assert tokens(gemma, (7, "Hello")) == [2, 7, *hello]


def test_tokenize_adds_bos_as_llama_tokenize_does(gemma) -> None:
    """``always`` is llama_tokenize's add_special: a prompt that starts with BOS gets a second one."""
    assert tokens(gemma, ("<bos>Hello",), bos="always") == gemma.encode("<bos>Hello", add_special=True)
    assert tokens(gemma, (2, 7), bos="always") == [2, 2, 7]
    assert tokens(gemma, ("Hello", 7), bos="never") == [*gemma.encode("Hello"), 7]


def test_parse_special_off_reads_markup_as_text(gemma) -> None:
    assert tokens(gemma, ("<bos>",), bos="never", parse_special=False) == gemma.encode(
        "<bos>", parse_special=False
    )
    assert tokens(gemma, ("<bos>",), bos="never", parse_special=False) != [2]


@pytest.mark.parametrize(("prompt", "param"), [((1, 10**9), "prompt[1]"), ((-1,), "prompt[0]")])
def test_an_id_outside_the_vocabulary_is_named_by_its_index(gemma, prompt, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        tokens(gemma, prompt)
    assert caught.value.param == param
    assert str(gemma.n_vocab - 1) in caught.value.message


def test_bos_counts_towards_the_room(gemma) -> None:
    assert tokens(gemma, (5, 6, 7), room=4) == [2, 5, 6, 7]
    with pytest.raises(Overflow) as caught:
        tokens(gemma, (5, 6, 7, 8), room=4)
    assert (caught.value.n_tokens, caught.value.at_least) == (5, False)


def test_text_that_cannot_fit_is_refused_before_it_is_tokenized_to_its_end(gemma) -> None:
    """The error says "at least": the count stops once the prompt is known not to fit."""
    with pytest.raises(Overflow) as caught:
        tokens(gemma, ("Hello there, how are you? " * 2000,), room=100)
    assert caught.value.at_least
    assert 100 < caught.value.n_tokens < 2000 * 7
