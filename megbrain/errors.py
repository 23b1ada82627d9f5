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
    "MemAllocError",
    "ArgumentError",
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


# User code run inside a function (output callbacks, callback_injector callbacks, Python
# operators) raises its own exceptions; they are re-raised as they are, so that
# ``except ValueError`` works as with the reference binding, which restored the Python
# exception after it crossed the C++ runtime. This attribute tells them from errors of our
# own kernels, which the executor wraps in a MegBrainError naming the operator.
_USER_EXC_ATTR = "_mgb_user_exception"


def mark_user_exception(exc: BaseException, note: str) -> BaseException:
    """Mark ``exc``, raised by user code running inside a function, to be re-raised as it is.

    Parameters
    ----------
    exc:
        The exception the user's code raised.
    note:
        Where it was raised (the operator or var); added with ``exc.add_note`` (appended to
        ``__notes__`` on Python 3.10), once even if ``exc`` passes several wrappers.

    Returns
    -------
    BaseException
        ``exc`` itself.
    """
    if getattr(exc, _USER_EXC_ATTR, False):
        return exc
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: no add_note, but __notes__ is where 3.11+ keeps them
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]
    setattr(exc, _USER_EXC_ATTR, True)
    return exc


def user_exception_note(where: str, tracker: object = None) -> str:
    """The note :func:`mark_user_exception` adds: ``where``, then the operator's tracker (see
    ``exc_opr_tracker_scope``) as a MegBrainError shows it."""
    if tracker is None:
        return where
    return f"{where}\nException tracker:\n  {tracker!r}"


def is_user_exception(exc: BaseException) -> bool:
    """Whether ``exc`` was marked by :func:`mark_user_exception`."""
    return getattr(exc, _USER_EXC_ATTR, False)


class ArgumentError(MegBrainError, TypeError, ValueError):
    """An operator function's argument has the wrong type or an invalid value (an axis given
    as ``1.5`` or ``'1'``, an axis out of range).

    The message names the function, the argument and what was expected. Also a
    ``TypeError`` and a ``ValueError``, the classes Python and NumPy raise for such
    arguments.
    """


class MemAllocError(MegBrainError, builtins.MemoryError):
    """A tensor could not be allocated (a shape too large for the comp node's memory).

    The message names the call and the size; also a ``MemoryError`` for code catching that.
    """


#: set by the operator layer: returns the public megbrain function the user called, or ""
_entry_point_resolver = None


def set_entry_point_resolver(resolver) -> None:
    """Install ``resolver(default) -> str`` (the operator layer does, at import) so that
    layers below it can name the user's call in messages without importing upwards."""
    global _entry_point_resolver
    _entry_point_resolver = resolver


def blame_prefix() -> str:
    """``"<function>: "`` naming the public megbrain function the user called, or ``""``
    (for error messages only)."""
    name = _entry_point_resolver("") if _entry_point_resolver is not None else ""
    return f"{name}: " if name else ""
