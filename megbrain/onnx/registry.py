"""The converter table: one function per ONNX op type and opset range.

A converter is registered with :func:`converter`; it receives a :class:`NodeContext` and
returns the node's output vars.  Each registration declares the attributes it reads, with the
values it accepts, so a whole model is validated before any operator is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import MegBrainError
from ..graph import static_shape as graph_static_shape

__all__ = [
    "ONNXConversionError",
    "converter",
    "lookup",
    "claimed_op_types",
    "Attr",
    "known_shape",
]

#: newest opset a converter claims when no upper bound is given
MAX_OPSET = 99


class ONNXConversionError(MegBrainError):
    """An ONNX model uses an op type, attribute value or dtype megbrain cannot import."""


@dataclass(frozen=True)
class Attr:
    """An attribute a converter reads.

    ``allowed`` (when given) is the set of accepted values; ``check`` a predicate on the value.
    """

    default: Any = None
    allowed: frozenset | None = None
    check: Callable[[Any], bool] | None = None
    why: str = ""


@dataclass
class Converter:
    op_type: str
    since: int
    until: int
    fn: Callable
    attrs: dict[str, Attr] = field(default_factory=dict)
    validate: Callable | None = None


_TABLE: dict[str, list[Converter]] = {}


def converter(
    op_types: str | Iterable[str],
    since: int = 1,
    until: int = MAX_OPSET,
    *,
    attrs: dict[str, Attr | Any] | None = None,
    validate: Callable | None = None,
) -> Callable:
    """Register ``fn(ctx)`` for ``op_types`` on opsets ``since .. until`` (inclusive).

    ``attrs`` maps attribute names to an :class:`Attr` or a plain default; an attribute that
    is not listed is refused at validation.  ``validate(node_view)`` may raise
    :class:`ONNXConversionError` for input-dependent limits (e.g. a dtype).
    """
    names = [op_types] if isinstance(op_types, str) else list(op_types)
    spec = {k: v if isinstance(v, Attr) else Attr(v) for k, v in (attrs or {}).items()}

    def deco(fn: Callable) -> Callable:
        for n in names:
            _TABLE.setdefault(n, []).append(Converter(n, since, until, fn, spec, validate))
        return fn

    return deco


def lookup(op_type: str, opset: int) -> Converter | None:
    """The converter of ``op_type`` at ``opset``, or None."""
    for c in _TABLE.get(op_type, ()):
        if c.since <= opset <= c.until:
            return c
    return None


def claimed_op_types() -> dict[str, list[tuple[int, int]]]:
    """Every op type with a converter, with the opset ranges claimed."""
    return {k: sorted((c.since, c.until) for c in v) for k, v in sorted(_TABLE.items())}


def as_numpy_attr(value: Any) -> Any:
    """Lists of attribute values become tuples (hashable, comparable)."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, np.ndarray):
        return value
    return value


def known_shape(var) -> tuple | None:
    """The static shape of ``var``, None for a run-time one (``imm_shape`` would say ``()``,
    which is also the shape of an ONNX 0-d value)."""
    shp = graph_static_shape(var.node)
    return None if shp is None else tuple(int(d) for d in shp)
