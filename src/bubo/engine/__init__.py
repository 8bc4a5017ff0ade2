"""Decode engines: the only package that touches llama.cpp (``llama.py``).

``fake.py`` is a scripted engine with the same interface for fast HTTP-layer
tests; it never imports ``llama_cpp``.
"""

from ._backlog import StreamNotRead as StreamNotRead
from ._backlog import logprob_bytes as logprob_bytes
from ._stops import StopMatcher as StopMatcher
from .base import CacheContents as CacheContents
from .base import EmbeddingModel as EmbeddingModel
from .base import Engine as Engine
from .base import EngineFailure as EngineFailure
from .base import EngineStatistics as EngineStatistics
from .base import FimTokens as FimTokens
from .base import GrammarRejected as GrammarRejected
from .base import ModelInfo as ModelInfo
from .base import PairFormat as PairFormat
from .base import RepackDecision as RepackDecision
from .base import SlotBusy as SlotBusy
from .base import SlotFile as SlotFile
from .base import SlotFileNoRoom as SlotFileNoRoom
from .base import SlotStatistics as SlotStatistics
from .base import SnapshotInfo as SnapshotInfo
from .lora import LoraAdapter as LoraAdapter
from .lora import request_scales as request_scales
