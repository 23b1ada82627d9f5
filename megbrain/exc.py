"""``exc``: the exception classes of the binding."""

from .errors import (
    AssertionError,  # noqa: A004
    ConversionError,
    GraphError,
    MegBrainError,
    SerializationError,
    ShapeDescError,
)

__all__ = [
    "AssertionError",
    "ConversionError",
    "GraphError",
    "MegBrainError",
    "SerializationError",
    "ShapeDescError",
]
