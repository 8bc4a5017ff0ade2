"""Facts about a GGUF file read without llama.cpp: metadata and the served model id."""

from .gguf import GGUFError as GGUFError
from .gguf import GGUFMetadata as GGUFMetadata
from .gguf import read_metadata as read_metadata
from .naming import ALIAS as ALIAS
from .naming import model_id_from_path as model_id_from_path
