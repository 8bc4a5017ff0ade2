"""Facts about a GGUF file read without llama.cpp: metadata, the served model id, the file's card."""

from .adapters import AdapterInfo as AdapterInfo
from .adapters import check_lora_adapter as check_lora_adapter
from .card import ModelCard as ModelCard
from .card import read_model_card as read_model_card
from .gguf import GGUFError as GGUFError
from .gguf import GGUFMetadata as GGUFMetadata
from .gguf import read_metadata as read_metadata
from .memory import KV_CACHE_TYPES as KV_CACHE_TYPES
from .memory import KvCacheSize as KvCacheSize
from .memory import is_quantized as is_quantized
from .memory import kv_bytes_per_token as kv_bytes_per_token
from .naming import ALIAS as ALIAS
from .naming import model_id_from_path as model_id_from_path
from .projector import ProjectorInfo as ProjectorInfo
from .projector import read_projector as read_projector
