"""``exc``: the exception classes of the binding."""

from .errors import (  # noqa: F401
    AssertionError,  # noqa: A004
    ConversionError,
    GraphError,
    MegBrainError,
    SerializationError,
    ShapeDescError,
)
