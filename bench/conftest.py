"""The benchmark's own unit tests import its modules as its scripts do: from bench/ itself."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
