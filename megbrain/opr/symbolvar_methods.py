"""SymbolVar's methods that build operators, bound once every family is loaded.

``base.SymbolVar`` holds what needs no operator family (identity, properties, naming);
``opr/__init__.py`` imports this module after the families, so these methods import each
family's front end at module level instead of inside every call.
"""

from __future__ import annotations

import numpy as np

from .base import SymbolVar
from .basic_arith import elemwise, fill_retain_dtype, mean, reduce_, typecvt
from .blas import matrix_mul
from .indexing import subtensor_getitem
from .operator_handle import Operator
from .tensor_manip import broadcast, dimshuffle, get_var_shape, reshape

__all__: list[str] = []


class _FamilyMethods:
    """The methods bound onto SymbolVar (a class, so they read as SymbolVar's own)."""

    @property
    def owner_opr(self):
        return Operator(self.node.owner)

    @property
    def shape(self) -> SymbolVar:
        """The shape as a symbolic var (GetVarShape)."""
        return get_var_shape(self)

    def axis_shape(self, axis: int) -> SymbolVar:
        return get_var_shape(self, axis=axis)

    # ---- methods --------------------------------------------------------------------------
    def reshape(self, *shape) -> SymbolVar:
        return reshape(self, _unpack_shape(shape))

    def broadcast(self, *shape) -> SymbolVar:
        return broadcast(self, _unpack_shape(shape))

    def flatten(self) -> SymbolVar:
        return self.reshape(-1)

    def dimshuffle(self, *pattern, ndim: int = 0) -> SymbolVar:
        if len(pattern) == 1 and isinstance(pattern[0], (list, tuple)):
            pattern = tuple(pattern[0])
        return dimshuffle(self, pattern, ndim=ndim)

    def astype(self, dtype) -> SymbolVar:
        return typecvt(self, dtype)

    def fill_retain_dtype(self, value) -> SymbolVar:
        return fill_retain_dtype(self, value)

    def _reduce(self, mode, axis, keepdims):
        return reduce_(self, mode, axis, keepdims)

    def sum(self, axis=None, keepdims=False):
        return self._reduce("SUM", axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return self._reduce("MAX", axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return self._reduce("MIN", axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        return self._reduce("PRODUCT", axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return mean(self, axis, keepdims)

    def __getitem__(self, idx):
        return subtensor_getitem(self, idx)

    # ---- arithmetic -----------------------------------------------------------------------
    def _ew(self, mode, *others, rev=False):
        args = (*others, self) if rev else (self, *others)
        return elemwise(*args, mode=mode)

    def _binary_opr(self, mode, rhs):
        """``elemwise([self, rhs], mode)``; the binding's entry point behind the operators."""
        return self._ew(mode, rhs)

    def _binary_opr_lhs(self, mode, lhs):
        """``elemwise([lhs, self], mode)``."""
        return self._ew(mode, lhs, rev=True)

    def __matmul__(self, o):
        return matrix_mul(self, o)

    def __rmatmul__(self, o):
        return matrix_mul(o, self)


def _unpack_shape(shape):
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        return shape[0]
    return shape


#: SymbolVar's arithmetic and comparison operators: (method, Elemwise mode, whether self is
#: the right operand); ``a > b`` is ``b < a``, as the binding computes it
_OPERATORS = (
    ("__add__", "ADD", False), ("__radd__", "ADD", True),
    ("__sub__", "SUB", False), ("__rsub__", "SUB", True),
    ("__mul__", "MUL", False), ("__rmul__", "MUL", True),
    ("__truediv__", "TRUE_DIV", False), ("__rtruediv__", "TRUE_DIV", True),
    ("__floordiv__", "FLOOR_DIV", False), ("__rfloordiv__", "FLOOR_DIV", True),
    ("__mod__", "MOD", False), ("__rmod__", "MOD", True),
    ("__pow__", "POW", False), ("__rpow__", "POW", True),
    ("__lshift__", "SHL", False), ("__rshift__", "SHR", False),
    ("__rlshift__", "SHL", True), ("__rrshift__", "SHR", True),
    ("__lt__", "LT", False), ("__le__", "LEQ", False),
    ("__gt__", "LT", True), ("__ge__", "LEQ", True),
)  # fmt: skip
#: the unary operators: (method, Elemwise mode)
_UNARY_OPERATORS = (("__neg__", "NEGATE"), ("__abs__", "ABS"))


def _binary_method(mode: str, rev: bool):
    def method(self, o):
        return self._ew(mode, o, rev=rev)

    return method


def _unary_method(mode: str):
    def method(self):
        return self._ew(mode)

    return method


for _name, _mode, _rev in _OPERATORS:
    setattr(_FamilyMethods, _name, _binary_method(_mode, _rev))
for _name, _mode in _UNARY_OPERATORS:
    setattr(_FamilyMethods, _name, _unary_method(_mode))

_CLASS_MACHINERY = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"})
for _name, _member in vars(_FamilyMethods).items():
    if _name not in _CLASS_MACHINERY:
        # named as SymbolVar's own in reprs and the API reference
        _fn = _member.fget if isinstance(_member, property) else _member
        _fn.__name__, _fn.__qualname__ = _name, f"SymbolVar.{_name}"
        setattr(SymbolVar, _name, _member)
