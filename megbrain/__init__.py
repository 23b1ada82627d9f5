"""megbrain: a Python implementation of MegBrain's computing-graph runtime.

``import megbrain as mgb`` gives the API that MegEngine 0.x exposed as ``megengine._internal``.
"""

from __future__ import annotations

from . import dtype
from .errors import (
    AssertionError,  # noqa: A004
    ConversionError,
    GraphError,
    MegBrainError,
    SerializationError,
)

__version__ = "0.1.0"
