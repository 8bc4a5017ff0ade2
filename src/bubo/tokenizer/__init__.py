"""Tokenization: one source of token ids for usage, counting and the prompt cache.

:func:`build_hf_tokenizer` rebuilds the GGUF's tokenizer with Hugging Face
``tokenizers`` from the file's metadata alone, giving llama.cpp's exact ids.
"""

from ._vocab import UnsupportedVocab as UnsupportedVocab
from .base import Tokenizer as Tokenizer
from .hf import HFTokenizer as HFTokenizer
from .hf import build_hf_tokenizer as build_hf_tokenizer
