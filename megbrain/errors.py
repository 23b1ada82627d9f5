"""The exception hierarchy of megbrain (re-exported as ``megbrain.exc``)."""

from __future__ import annotations

import builtins

__all__ = [
    "MegBrainError",
    "GraphError",
    "ConversionError",
    "SerializationError",
    "AssertionError",
    "ShapeDescError",
]


class MegBrainError(RuntimeError):
    """Base class of every error raised by megbrain.

    Parameters
    ----------
    msg:
        The message.
    tracker:
        The Python object associated (through ``config.exc_opr_tracker_scope``) with the
        operator that raised, or None.
    tracker_grad_orig:
        The tracker of the forward operator when the failing operator is part of a gradient.
    """

    def __init__(self, msg: str = "", tracker: object = None, tracker_grad_orig: object = None):
        super().__init__(msg)
        self.msg = msg
        self.tracker = tracker
        self.tracker_grad_orig = tracker_grad_orig

    def __str__(self) -> str:
        lines = [self.msg]
        if self.tracker is not None:
            lines.append(f"Exception tracker:\n  {self.tracker!r}")
        if self.tracker_grad_orig is not None:
            lines.append(f"Exception tracker (grad orig):\n  {self.tracker_grad_orig!r}")
        return "\n".join(lines)


class GraphError(MegBrainError):
    """A computing graph was used wrongly (bad var, stale function, wrong part order...)."""


class ConversionError(MegBrainError, TypeError):
    """A value or dtype can not be converted to what megbrain supports."""


class SerializationError(MegBrainError):
    """A graph file could not be written or read."""


class AssertionError(MegBrainError, builtins.AssertionError):  # noqa: A001
    """Raised by ``opr.assert_equal`` and internal consistency checks."""


class ShapeDescError(GraphError, builtins.AssertionError):
    """A shape descriptor (ints and int vars) is malformed.

    Also an ``AssertionError``: the reference binding checked shape descriptors with asserts,
    and code written against it catches that class.
    """
