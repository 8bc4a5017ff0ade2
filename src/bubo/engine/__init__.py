"""Decode engines: the only package that touches llama.cpp (``llama.py``).

``fake.py`` is a scripted engine with the same interface for fast HTTP-layer
tests; it never imports ``llama_cpp``.  What the service and the API hold of an
engine are its ports (``_ports.py``, one Protocol per role); what it fails with
are its errors (``errors.py``, each with a cause, mapped to a response at the
edge); what it reports are its values (``values.py``, ``stats.py``).
"""

from ._backlog import logprob_bytes as logprob_bytes
from ._ports import EmbeddingModel as EmbeddingModel
from ._ports import Engine as Engine
from ._ports import Generator as Generator
from ._ports import ImageReader as ImageReader
from ._ports import Introspection as Introspection
from ._ports import Lifecycle as Lifecycle
from ._ports import LoraControl as LoraControl
from ._ports import ModelFacts as ModelFacts
from ._ports import Sleeper as Sleeper
from ._ports import SlotFiles as SlotFiles
from ._stops import StopMatcher as StopMatcher
from .errors import Cause as Cause
from .errors import EngineError as EngineError
from .errors import EngineFailure as EngineFailure
from .errors import GrammarRejected as GrammarRejected
from .errors import SlotBusy as SlotBusy
from .errors import SlotFileNoRoom as SlotFileNoRoom
from .errors import StreamNotRead as StreamNotRead
from .lora import LoraAdapter as LoraAdapter
from .lora import request_scales as request_scales
from .stats import EngineStatistics as EngineStatistics
from .stats import SlotStatistics as SlotStatistics
from .values import CacheContents as CacheContents
from .values import FimTokens as FimTokens
from .values import ModelInfo as ModelInfo
from .values import PairFormat as PairFormat
from .values import RepackDecision as RepackDecision
from .values import SlotFile as SlotFile
from .values import SnapshotInfo as SnapshotInfo
